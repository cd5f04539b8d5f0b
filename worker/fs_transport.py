"""The embedded default's broker: kombu's filesystem transport, with each message written
whole before a consumer can see it.

kombu's own `_put` creates the message file under its final name and then writes it; its
`_get` moves away any file with a matching name without taking the writer's lock. A worker
polling in between takes an empty file: the message is lost and the worker's consumer fails on
decoding it (seen as a run left queued while its worker sat idle, issue 36). Here a message is
written under a name `_get` skips (a leading dot: no queue matches what follows it) and renamed
into place; a rename within a folder is atomic, so a consumer sees no file or the whole one."""

from __future__ import annotations

import os
import uuid
from time import monotonic

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


class Transport(filesystem.Transport):
    Channel = Channel
