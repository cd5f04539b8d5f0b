"""The embedded default's broker: kombu's filesystem transport, with each message written
whole before a consumer can see it.

kombu's own `_put` creates the message file under its final name and then writes it; its
`_get` moves away any file with a matching name without taking the writer's lock. A worker
polling in between takes an empty file: the message is lost and the worker's consumer fails on
decoding it (seen as a run left queued while its worker sat idle, issue 36). Here a message is
written under a name `_get` skips (a leading dot: no queue matches what follows it) and renamed
into place; a rename within a folder is atomic, so a consumer sees no file or the whole one.

Woken, not only polled: kombu's consumer sleeps `polling_interval` between empty polls, so a
run submitted during the sleep waited up to that long before a worker took it. Each consumer
here waits on a named pipe of its own (`<queue folder>/.wake/<pid>-<id>.fifo`, opened for
reading and writing so it never sees end-of-file), and every publish writes a byte to each pipe
in that folder: the consumer polls again at once. The interval stays as the fallback (a pipe
that cannot be made). A pipe nobody reads any more (its worker died) is removed by the next
publisher, which finds no reader (ENXIO)."""

from __future__ import annotations

import errno
import os
import select
import uuid
from queue import Empty
from time import monotonic, sleep

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Put `payload` onto `queue`, atomically (see the module's docstring)."""
        # kombu's name (ordered by publication time), so consumers keep the same order
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        part = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(part, "wb") as f:
                f.write(dumps(payload).encode())
            os.replace(part, final)
        except OSError as exc:
            try:
                os.unlink(part)
            except OSError:
                pass
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc
        wake(self.data_folder_out)


WAKE = ".wake"  # a leading dot: no queue's `_get` takes it for a message
PIPE = ".fifo"  # a consumer's pipe in WAKE; any other name there is one still being made


def wake(folder: str) -> None:
    """One byte to every consumer's pipe in `folder`: poll now."""
    d = os.path.join(folder, WAKE)
    try:
        names = os.listdir(d)
    except OSError:
        return  # no consumer has a pipe (or pipes are not possible here): they poll
    for name in names:
        if not name.endswith(PIPE):
            continue  # a pipe being made (Waker): not yet open, not to be removed
        path = os.path.join(d, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nobody reads it: its worker is gone
                _unlink(path)
            continue
        try:
            os.write(fd, b"\0")
        except OSError:
            pass  # full (EAGAIN): its consumer is woken already
        finally:
            os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class Waker:
    """A consumer's named pipe: `wait(s)` returns after s seconds or at the first publish."""

    def __init__(self, folder: str):
        d = os.path.join(folder, WAKE)
        os.makedirs(d, exist_ok=True)
        self.path = os.path.join(d, f"{os.getpid()}-{uuid.uuid4().hex[:8]}{PIPE}")
        # made and opened under another name, then renamed into place: a publisher that saw
        # the pipe before it had a reader took it for a dead worker's and removed it (ENXIO),
        # and this consumer lost its wake-ups for good
        making = self.path + ".new"
        os.mkfifo(making, 0o600)
        try:
            self.fd = os.open(making, os.O_RDWR | os.O_NONBLOCK)
            os.rename(making, self.path)
        except OSError:
            _unlink(making)
            raise

    def wait(self, seconds: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], seconds)
        if ready:
            try:
                while os.read(self.fd, 4096):  # every pending byte: one poll covers them
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        os.close(self.fd)
        _unlink(self.path)


class Transport(filesystem.Transport):
    Channel = Channel
    _waker: Waker | None = None
    _no_waker = False

    def drain_events(self, connection, timeout=None):
        """kombu's loop (virtual.Transport.drain_events), its pause between empty polls
        ended early by a publish (Waker)."""
        time_start = monotonic()
        get = self.cycle.get
        interval = self.polling_interval
        if timeout and interval and interval > timeout:
            interval = timeout
        while 1:
            try:
                get(self._deliver, timeout=timeout)
            except Empty:
                if timeout is not None and monotonic() - time_start >= timeout:
                    raise TimeoutError from None  # socket.timeout, as kombu raises
                if interval is not None:
                    self._pause(connection, interval)
            else:
                break

    def _pause(self, connection, seconds: float) -> None:
        waker = self._waker
        opts = connection.client.transport_options
        if waker is None and not self._no_waker and opts.get("wake", True):
            folder = opts.get("data_folder_in")
            try:
                self._waker = Waker(folder)
            except (OSError, TypeError):
                self._no_waker = True  # no pipes here: poll as kombu does
            else:
                # a publish between the empty poll and the pipe's making woke nobody: poll
                # again now, and wait on the pipe from the next pause on
                return
        if waker is None:
            sleep(seconds)
        else:
            waker.wait(seconds)

    def close_connection(self, connection):
        if self._waker is not None:
            self._waker.close()
            self._waker = None
        super().close_connection(connection)
