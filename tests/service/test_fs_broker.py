"""The embedded broker never hands a worker a half-written message (paralab_core/fs_transport.py).

The oracle is kombu's own `_get`, called at the worst moment: while the message is being
written. kombu's stock `_put` (planted below) shows the defect the transport fixes."""

from __future__ import annotations

import pytest
from kombu import Connection
from kombu.transport import filesystem

from paralab_core import fs_transport


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
    conn, ch = channel(tmp_path, "paralab_core.fs_transport:Transport")
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
    from paralab_core.queue import make_celery
    app = make_celery(Settings(data_dir=tmp_path))
    with app.connection_for_write() as conn:
        assert isinstance(conn.default_channel, fs_transport.Channel)


def test_a_publish_wakes_a_consumer_in_its_pause(tmp_path):
    """A consumer between two polls (its pause set to an hour) takes a message published
    meanwhile at once: the publish writes to its pipe. A consumer that only slept would still
    be asleep when the join gives up (the check can fail)."""
    import threading

    from tests.conftest import wait_for
    folder = tmp_path / "queue"
    folder.mkdir()
    opts = {"data_folder_in": str(folder), "data_folder_out": str(folder),
            "control_folder": str(tmp_path / "control"),  # kombu's default: ./control
            "store_processed": False, "polling_interval": 3600}
    transport = "paralab_core.fs_transport:Transport"
    consumer = Connection("filesystem://", transport=transport, transport_options=opts)
    got = []
    sq = consumer.SimpleQueue("q")
    t = threading.Thread(target=lambda: got.append(sq.get(block=True, timeout=None)),
                         daemon=True)
    t.start()
    # the consumer polled, found nothing, and now waits on its own pipe
    wait_for(lambda: list((folder / fs_transport.WAKE).glob("*.fifo")), 30, "its pipe")
    publisher = Connection("filesystem://", transport=transport, transport_options=opts)
    publisher.SimpleQueue("q").put({"run": "42"})
    t.join(60)
    assert not t.is_alive(), "the consumer slept through the publish"
    assert got[0].payload == {"run": "42"}
    got[0].ack()
    publisher.close()
    consumer.close()
    assert not list((folder / fs_transport.WAKE).iterdir())  # closed: its pipe is gone


def test_a_dead_consumers_pipe_is_removed_by_the_next_publish(tmp_path):
    import os
    d = tmp_path / "queue" / fs_transport.WAKE
    d.mkdir(parents=True)
    os.mkfifo(d / "123-dead.fifo")  # no process reads it
    fs_transport.wake(str(tmp_path / "queue"))
    assert not list(d.iterdir())


def test_a_publish_while_a_pipe_is_being_made_neither_removes_it_nor_is_lost(tmp_path,
                                                                             monkeypatch):
    """A publish that lands after a consumer's empty poll, while its pipe is being made (made,
    not yet opened): the publisher must not take the pipe for a dead worker's and remove it
    (the consumer then lost its wake-ups for good, and slept a whole polling interval), and
    the consumer polls once more before its first wait on the pipe (that publish woke nobody).
    Seen once in a full CI pass: a consumer slept through a publish."""
    import os
    import threading

    folder = tmp_path / "queue"
    folder.mkdir()
    real = os.mkfifo

    def mkfifo_then_publish(path, *a, **kw):
        real(path, *a, **kw)
        fs_transport.wake(str(folder))  # the publisher, between the making and the opening
    monkeypatch.setattr(fs_transport.os, "mkfifo", mkfifo_then_publish)
    w = fs_transport.Waker(str(folder))
    monkeypatch.setattr(fs_transport.os, "mkfifo", real)
    try:
        assert os.path.exists(w.path)  # still there, under its name
        t = threading.Thread(target=w.wait, args=(3600.0,), daemon=True)
        t.start()
        fs_transport.wake(str(folder))  # a later publish wakes it
        t.join(30)
        assert not t.is_alive(), "the pipe no longer wakes its consumer"
    finally:
        w.close()

    # the pause that makes the pipe returns at once (the loop polls again), later ones wait
    conn = Connection("filesystem://", transport="paralab_core.fs_transport:Transport",
                      transport_options={"data_folder_in": str(folder),
                                         "data_folder_out": str(folder)})
    transport = conn.transport
    t = threading.Thread(target=transport._pause, args=(conn.connection, 3600.0), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the first pause slept before its pipe could be woken"
    assert transport._waker is not None
    t = threading.Thread(target=transport._pause, args=(conn.connection, 3600.0), daemon=True)
    t.start()
    t.join(0.3)
    assert t.is_alive()  # a later pause waits on the pipe ...
    fs_transport.wake(str(folder))
    t.join(30)
    assert not t.is_alive()  # ... until a publish
    conn.close()
