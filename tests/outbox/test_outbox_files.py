"""An outbox file where it cannot be written: read by the commands that only read it, and
refused by the rest with an error naming the file, the cause and the fix (a
configuration error, never "retry later").

A read-only filesystem is made for real: the outbox's folder bind-mounted read-only in a
mount namespace of the test's own (``unshare``; the tests run as root, where file
permissions do not stop a write, and a read-only mount does). Each run first proves the
fault is there: the file cannot be opened for writing (``EROFS``), and SQLite's own
read-only open fails as operators met it (``SQLITE_CANTOPEN``).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sessionrepo import (
    InvalidArgument,
    Message,
    NotARepository,
    TranscriptWriter,
    open_repository,
)
from sessionrepo.models import Session
from sessionrepo.outbox.table import Outbox
from sessionrepo.outbox.writer import open_outbox_database

SESSIONREPO = str(Path(sys.executable).with_name("sessionrepo"))

#: Run in the namespace before the command: exit 97 unless the folder is read-only for
#: real, 98 unless SQLite's plain read-only open fails as reported (when asked to check).
_PROVE_FAULT = textwrap.dedent(
    """
    import errno, os, sqlite3, sys
    path, expect_cantopen = sys.argv[1], sys.argv[2] == "1"
    try:
        os.close(os.open(path, os.O_RDWR))
    except OSError as exc:
        if exc.errno != errno.EROFS:
            sys.exit(97)
    else:
        sys.exit(97)
    if expect_cantopen:
        try:
            sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute(
                "SELECT count(*) FROM pending_outbox"
            ).fetchall()
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorname != "SQLITE_CANTOPEN":
                sys.exit(98)
        else:
            sys.exit(98)
    """
)

_MOUNT = (
    'mount --bind -o ro "$1" "$1" && mount -o remount,ro,bind "$1" "$1" && '
    '"$2" -c "$3" "$4" "$5" && shift 5 && exec "$@"'
)


def _read_only(
    folder: Path, outbox: Path, *command: str, expect_cantopen: bool = True
) -> subprocess.CompletedProcess[str]:
    """``command``, run where ``folder`` is a read-only filesystem; the fault proved
    first on ``outbox``."""
    done = subprocess.run(
        [
            "unshare",
            "-rm",
            "sh",
            "-c",
            _MOUNT,
            "sh",
            str(folder),
            sys.executable,
            _PROVE_FAULT,
            str(outbox),
            "1" if expect_cantopen else "0",
            *command,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode not in (97, 98), f"the fault did not happen: {done}"
    return done


@pytest.fixture(scope="module")
def read_only_mounts(tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("probe")
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", 'mount --bind -o ro "$0" "$0"', str(folder)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        pytest.skip(f"no mount namespace for a read-only bind mount here: {done.stderr.strip()}")


def _message(text: str) -> Message:
    return Message(role="user", content=text)


def _parked_outbox(folder: Path, sessions: dict[str, int]) -> Path:
    """An outbox file in ``folder`` with ``sessions``' messages parked, closed cleanly
    (everything in the file: no ``-wal``, no ``-shm``)."""
    folder.mkdir()
    path = folder / "outbox.db"
    outbox = Outbox(open_outbox_database(f"sqlite:///{path}"))
    try:
        for session_id, count in sessions.items():
            messages = [_message(f"{session_id} {index}") for index in range(count)]
            outbox.park(session_id, messages, Session(id=session_id), reason="primary down")
    finally:
        outbox.close()
    assert sorted(p.name for p in folder.iterdir()) == ["outbox.db"]
    return path


def _python(script: str) -> tuple[str, str, str]:
    return sys.executable, "-c", textwrap.dedent(script)


# -- reading ------------------------------------------------------------------------------


@pytest.mark.usefixtures("read_only_mounts")
def test_outbox_status_reads_an_outbox_on_a_read_only_filesystem(
    database_url: str, tmp_path: Path
) -> None:
    path = _parked_outbox(tmp_path / "ro", {"a": 2, "b": 1})
    done = _read_only(
        path.parent, path, SESSIONREPO, "outbox", "--outbox-url", str(path), "status", "--json"
    )
    assert done.returncode == 0, done.stderr
    health = json.loads(done.stdout)
    assert (health["pending"], health["dead"]) == (3, 0)
    assert {s["session_id"]: s["pending"] for s in health["sessions"]} == {"a": 2, "b": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["outbox.db"]  # nothing made


@pytest.mark.usefixtures("read_only_mounts")
def test_doctor_and_the_console_read_an_outbox_on_a_read_only_filesystem(
    database_url: str, tmp_path: Path
) -> None:
    path = _parked_outbox(tmp_path / "ro", {"a": 2})
    done = _read_only(
        path.parent,
        path,
        *_python(
            f"""
            import json
            from sessionrepo.ops.doctor import run_doctor
            from sessionrepo.outbox.table import Outbox
            from sessionrepo.outbox.writer import open_outbox_database

            report = run_doctor({database_url!r}, outbox_url={str(path)!r})
            [check] = [c for c in report.checks if c.name == "outbox"]
            # What `sessionrepo serve` opens for its health page (read-only console).
            console = Outbox(open_outbox_database({str(path)!r}, read_only=True))
            print(json.dumps([check.status, check.detail, console.status().pending]))
            console.database.dispose()
            """
        ),
    )
    assert done.returncode == 0, done.stderr
    status, detail, pending = json.loads(done.stdout)
    assert (status, pending) == ("warn", 2)
    assert detail.startswith("2 pending, 0 dead")


@pytest.mark.usefixtures("read_only_mounts")
def test_a_read_only_outbox_whose_wal_holds_transactions_is_read_with_them(
    database_url: str, tmp_path: Path
) -> None:
    """``immutable`` would leave out what the ``-wal`` holds: with its ``-shm`` there, the
    file is read ``mode=ro``, the WAL's rows included; without, refused, saying why."""
    source = tmp_path / "live"
    path = _parked_outbox(source, {"old": 1})
    outbox = Outbox(open_outbox_database(f"sqlite:///{path}"))
    try:
        outbox.park("new", [_message("in the wal")], Session(id="new"), reason="down")
        # A copy of the files as a gateway that died would leave them: the row is in
        # the -wal only (the file itself has not been checkpointed).
        with_shm, without_shm = tmp_path / "with-shm", tmp_path / "without-shm"
        for target, suffixes in ((with_shm, ("", "-wal", "-shm")), (without_shm, ("", "-wal"))):
            target.mkdir()
            for suffix in suffixes:
                shutil.copyfile(f"{path}{suffix}", target / f"outbox.db{suffix}")
    finally:
        outbox.close()
    only_file = sqlite3.connect(f"file:{without_shm / 'outbox.db'}?immutable=1", uri=True)
    assert only_file.execute("SELECT count(*) FROM pending_outbox").fetchone() == (1,)
    only_file.close()

    status = (SESSIONREPO, "outbox", "--outbox-url")
    read = _read_only(
        with_shm,
        with_shm / "outbox.db",
        *status,
        str(with_shm / "outbox.db"),
        "status",
        "--json",
        expect_cantopen=False,
    )
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout)["pending"] == 2  # the -wal's row too

    refused = _read_only(
        without_shm,
        without_shm / "outbox.db",
        *status,
        str(without_shm / "outbox.db"),
        "status",
    )
    assert refused.returncode == 1
    assert str(without_shm / "outbox.db-wal") in refused.stderr
    assert "read-only filesystem" in refused.stderr
    assert "copy the file and its -wal" in refused.stderr


# -- writing ------------------------------------------------------------------------------


@pytest.mark.usefixtures("read_only_mounts")
def test_a_writer_on_a_read_only_outbox_names_the_file_the_cause_and_the_fix(
    database_url: str, tmp_path: Path
) -> None:
    path = _parked_outbox(tmp_path / "ro", {"a": 1})
    done = _read_only(
        path.parent,
        path,
        *_python(
            f"""
            from sessionrepo import InvalidArgument, TranscriptWriter, open_repository

            repository = open_repository({database_url!r})
            try:
                TranscriptWriter(repository, outbox_url={str(path)!r})
            except InvalidArgument as exc:
                print(exc)
            else:
                raise SystemExit("a writer opened a read-only outbox")
            """
        ),
    )
    assert done.returncode == 0, done.stderr
    assert str(path) in done.stdout
    assert "Read-only file system" in done.stdout
    assert "Remount the filesystem read-write" in done.stdout
    assert "SQLITE_CANTOPEN" not in done.stdout

    for command in (("drain",), ("retry-dead",)):
        refused = _read_only(
            path.parent,
            path,
            SESSIONREPO,
            "--url",
            database_url,
            "outbox",
            "--outbox-url",
            str(path),
            *command,
        )
        assert refused.returncode == 1, (command, refused)
        assert str(path) in refused.stderr
        assert "Read-only file system" in refused.stderr
        assert "unable to open database file" not in refused.stderr


@pytest.mark.usefixtures("read_only_mounts")
def test_an_outbox_that_cannot_be_created_on_a_read_only_filesystem_is_a_configuration_error(
    database_url: str, tmp_path: Path
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    witness = folder / "witness"
    witness.write_text("")  # the fault proof's file: the folder is read-only
    path = folder / "sub" / "outbox.db"
    done = _read_only(
        folder,
        witness,
        *_python(
            f"""
            from sessionrepo import InvalidArgument, TranscriptWriter, open_repository

            repository = open_repository({database_url!r})
            try:
                TranscriptWriter(repository, outbox_url={str(path)!r})
            except InvalidArgument as exc:
                print(exc)
            """
        ),
        expect_cantopen=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"the outbox file {path} cannot be created (Read-only file system)" in done.stdout
    assert not path.parent.exists()


def test_a_directory_or_a_path_through_a_file_is_a_configuration_error(
    database_url: str, tmp_path: Path
) -> None:
    repository = open_repository(database_url)
    plain_file = tmp_path / "notes.txt"
    plain_file.write_text("not a folder")
    try:
        with pytest.raises(InvalidArgument) as directory:
            TranscriptWriter(repository, outbox_url=str(tmp_path))
        assert directory.value.field == "outbox_url"
        assert f"{tmp_path} is a directory, not an outbox file" in str(directory.value)
        assert str(tmp_path / "outbox.db") in str(directory.value)  # what to give instead

        through = plain_file / "outbox.db"
        with pytest.raises(InvalidArgument) as not_a_folder:
            TranscriptWriter(repository, outbox_url=f"sqlite:///{through}")
        assert f"the outbox file {through} cannot be created (Not a directory)" in str(
            not_a_folder.value
        )
        assert plain_file.read_text() == "not a folder"
        with pytest.raises(NotARepository):  # reading: the dialect's word for no file
            open_outbox_database(str(through), read_only=True)
    finally:
        repository.close()


def test_an_existing_outbox_that_fails_for_a_passing_reason_stays_unavailable(
    database_url: str, tmp_path: Path
) -> None:
    """Out of file descriptors (a real failure, which passes): not a configuration error."""
    path = _parked_outbox(tmp_path / "box", {"a": 1})
    script = textwrap.dedent(
        f"""
        import os, resource
        from sessionrepo import BackendUnavailable, InvalidArgument, TranscriptWriter
        from sessionrepo import open_repository

        repository = open_repository({database_url!r})
        repository.list_sessions()  # the primary's connection made before the limit
        open_now = len(os.listdir("/proc/self/fd")) - 1  # (less the listing's own)
        # From here on, no file can be opened: SQLite's open of the outbox fails.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_now, hard))
        try:
            TranscriptWriter(repository, outbox_url={str(path)!r})
        except InvalidArgument as exc:
            raise SystemExit(f"configuration error for a passing failure: {{exc}}")
        except BackendUnavailable as exc:
            print(exc)
        else:
            raise SystemExit("no file descriptor was needed")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert f"the outbox file {path} could not be opened now" in done.stdout
    # The cause as it reached us: the file system's (creating the file is tried first), or
    # SQLite's, which does not say more.
    assert "Too many open files" in done.stdout or "SQLITE_CANTOPEN" in done.stdout
    assert "retry later" in done.stdout
