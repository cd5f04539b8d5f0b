"""The header half of a streamed multipart/form-data body (python-multipart's callbacks), shared
by the routes that take files as the body arrives (uploads, imports): each part's headers are
collected and its Content-Disposition options handed to `started`; what a part's bytes become is
the subclass's (`data`, `end`)."""

from __future__ import annotations

from python_multipart.multipart import parse_options_header


class StreamedParts:
    def __init__(self) -> None:
        self.header, self.value, self.headers = b"", b"", {}

    def callbacks(self) -> dict:
        return {"on_part_begin": self.begin, "on_header_field": self.h_field,
                "on_header_value": self.h_value, "on_header_end": self.h_end,
                "on_headers_finished": self.h_done, "on_part_data": self.data,
                "on_part_end": self.end}

    def begin(self):
        self.headers = {}

    def h_field(self, data, start, end):
        self.header += data[start:end]

    def h_value(self, data, start, end):
        self.value += data[start:end]

    def h_end(self):
        self.headers[self.header.lower()] = self.value
        self.header, self.value = b"", b""

    def h_done(self):
        _, opts = parse_options_header(self.headers.get(b"content-disposition", b""))
        self.started(opts)

    def started(self, opts: dict) -> None:
        """A part begins: `opts` are its Content-Disposition options (b"name", b"filename")."""
        raise NotImplementedError

    def data(self, data, start, end):
        raise NotImplementedError

    def end(self):
        raise NotImplementedError
