"""The queue's database and its procedure calls: opened on first use, checked once against the install."""

from __future__ import annotations

from ..config import Config
from ..db import Database, normalise_url
from ..errors import ConfigError, DatabaseError
from .calls import Procs
from .install import check_installed, install


class Store:
    """One queue's connection to its table: `database` (engine, transactions) and `procs` (the
    stored procedures, available once `check_installed` has passed). Every other part reaches the
    database through one Store, so a test or a monkeypatch of `procs` sees every call."""

    def __init__(self, config: Config) -> None:
        """Checks `database_url` (it parses and names MySQL/MariaDB or PostgreSQL: a ConfigError
        when the Queue is built, not at its first publish); connects only on first use."""
        urls = {"database_url": config.database_url, "listen_url": config.listen_url}
        for option, url in urls.items():
            if url is None:
                continue
            try:
                backend = normalise_url(url).get_backend_name()
            except DatabaseError as exc:
                raise ConfigError(f'Option "{option}": {exc}') from None
            if backend != "postgresql" and (option == "listen_url" or config.pooled):
                which = "listen_url" if option == "listen_url" else "pooled"
                raise ConfigError(f'Option "{which}" is for PostgreSQL only (LISTEN, PgBouncer).')
        self.config = config
        self._db: Database | None = None
        self._procs: Procs | None = None

    @property
    def opened(self) -> bool:
        """Whether the engine has been built (building it never connects)."""
        return self._db is not None

    @property
    def database(self) -> Database:
        if self._db is None:
            cfg = self.config
            url = cfg.database_url
            if url is None:
                from ..db.embedded import embedded_url

                self._db = Database(embedded_url(cfg.data_dir), cfg.logger, cfg.lock_timeout)
                install(self._db, cfg.table_name)  # the embedded database is bgq's own
            else:
                self._db = Database(
                    url, cfg.logger, cfg.lock_timeout, pooled=cfg.pooled, listen_url=cfg.listen_url
                )
        return self._db

    @property
    def checked(self) -> bool:
        """Whether `procs` is ready (the installed version has been checked)."""
        return self._procs is not None

    @property
    def procs(self) -> Procs:
        """The procedure calls, once the installed version has been checked."""
        if self._procs is None:
            check_installed(self.database, self.config.table_name)
            self._procs = Procs(self.database, self.config.table_name, self.config.clock)
        return self._procs

    def install(self) -> bool:
        """Create the table and install the procedures (`bgq install-procs`); False if up to date."""
        changed = install(self.database, self.config.table_name)
        self._procs = None
        return changed

    def close(self) -> None:
        if self._db is not None:
            self._db.dispose()
        self._db = None
        self._procs = None
