"""The embedded broker never hands a worker a half-written message (worker/fs_transport.py).

The oracle is kombu's own `_get`, called at the worst moment: while the message is being
written. kombu's stock `_put` (planted below) shows the defect the transport fixes."""

from __future__ import annotations

import pytest
from kombu import Connection
from kombu.transport import filesystem

from worker import fs_transport


def channel(tmp_path, transport):
    folder = tmp_path / "queue"
    folder.mkdir()
    conn = Connection("filesystem://", transport=transport, transport_options={
        "data_folder_in": str(folder), "data_folder_out": str(folder),
        "store_processed": True, "processed_folder": str(tmp_path)})
    return conn, conn.default_channel


def get_while_writing(monkeypatch, module, ch):
    """Publish one message; while its bytes are being produced, a consumer polls."""
    seen = []
    real = module.dumps

    def dumps(payload):
        try:
            seen.append(ch._get("q"))
        except filesystem.Empty:
            seen.append(None)
        return real(payload)
    monkeypatch.setattr(module, "dumps", dumps)
    ch._put("q", {"body": "run 42"})
    monkeypatch.setattr(module, "dumps", real)
    return seen


def test_a_consumer_polling_mid_write_sees_nothing_then_the_whole_message(tmp_path,
                                                                         monkeypatch):
    conn, ch = channel(tmp_path, "worker.fs_transport:Transport")
    assert isinstance(ch, fs_transport.Channel)
    assert get_while_writing(monkeypatch, fs_transport, ch) == [None]
    assert ch._get("q") == {"body": "run 42"}
    assert not [p for p in (tmp_path / "queue").iterdir()]  # no .part left behind
    conn.close()


def test_kombus_own_put_loses_the_message_to_a_mid_write_poll(tmp_path, monkeypatch):
    """The planted defect: the file exists, empty, before it is written."""
    conn, ch = channel(tmp_path, "filesystem")
    with pytest.raises(ValueError):  # the consumer decodes an empty file
        get_while_writing(monkeypatch, filesystem, ch)
    monkeypatch.undo()
    with pytest.raises(filesystem.Empty):  # and the message is gone
        ch._get("q")
    conn.close()


def test_the_embedded_default_publishes_through_it(tmp_path):
    from backend.core.config import Settings
    from worker.app import make_celery
    app = make_celery(Settings(data_dir=tmp_path))
    with app.connection_for_write() as conn:
        assert isinstance(conn.default_channel, fs_transport.Channel)
