"""A ThreadingHTTPServer for test servers whose clients hang up on purpose.

Tests that drop, reset or abandon connections (a callback raising mid-stream, a client
reset) make the stdlib server print "Exception occurred during processing of request"
and a traceback to stderr. A client going away is expected there; anything else is still
reported.
"""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer
from typing import Any


class QuietHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)
