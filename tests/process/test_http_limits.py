"""Requests past the server's size limits get an answer, over raw sockets against run.py:
a head past 64 KiB is 431, a body past the server's bound 413 (chunked or declared), each a
Matrix error with an access line, where Tornado alone closes the connection or answers a
bare 400 (issue 25)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.support.servers import ServerProcess

MAX_BODY = 65536
BOUND = 1 << 20  # the server's own bound: max(4 x max_body_size, 1 MiB)
HEAD_LIMIT = 65536  # Tornado's max_header_size


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("limits"), max_body_size=MAX_BODY)
    yield process
    process.stop()


def exchange(port: int, data: bytes) -> bytes:
    """Send `data` (from a thread, so a server that stops reading cannot block us) and read
    everything the server answers until it closes; a reset after the answer is normal."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)

    def send() -> None:
        try:
            sock.sendall(data)
        except OSError:  # the server closed after answering: it needed no more
            pass

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    finally:
        sender.join(30)
        sock.close()
    return received


def parse(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The answers in `raw`, each (status, headers by lower-case name, body)."""
    answers = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        answers.append((int(lines[0].split()[1]), headers, rest[:length]))
        raw = rest[length:]
    return answers


def assert_too_large(answer: tuple[int, dict[str, str], bytes], status: int, text: str) -> None:
    code, headers, body = answer
    assert code == status, answer
    assert headers["content-type"] == "application/json" and len(headers["x-request-id"]) == 16
    assert json.loads(body) == {"errcode": "M_TOO_LARGE", "error": text}


def request(method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: localhost", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(total: int, piece: int = 65536) -> bytes:
    out = b""
    while total > 0:
        size = min(piece, total)
        out += b"%x\r\n" % size + b"x" * size + b"\r\n"
        total -= size
    return out + b"0\r\n\r\n"


@pytest.mark.parametrize("headers", [
    {"X-Big": "a" * (HEAD_LIMIT + 100)},
    {f"X-Header-{i}": "b" * 100 for i in range(HEAD_LIMIT // 100)},
], ids=["one-long-header", "many-headers"])
def test_headers_over_the_limit_are_431(server, headers):
    (answer,) = parse(exchange(server.port, request("GET", "/_matrix/client/versions", headers)))
    assert_too_large(answer, 431, f"Request headers are larger than {HEAD_LIMIT} bytes")
    assert answer[1]["connection"] == "close"


def test_headers_under_the_limit_are_served(server):
    (answer,) = parse(exchange(server.port, request("GET", "/_matrix/client/versions",
                                                     {"X-Big": "a" * (HEAD_LIMIT - 1000), "Connection": "close"})))
    assert answer[0] == 200


def test_a_431_follows_the_answer_before_it_on_a_kept_alive_connection(server):
    data = request("GET", "/_matrix/client/versions") + request("GET", "/health", {"X-Big": "a" * (HEAD_LIMIT + 1)})
    first, second = parse(exchange(server.port, data))
    assert first[0] == 200 and "versions" in json.loads(first[2])
    assert_too_large(second, 431, f"Request headers are larger than {HEAD_LIMIT} bytes")


@pytest.mark.parametrize("path", ["/_matrix/client/v3/login", "/_matrix/client/versions", "/account/"])
def test_a_chunked_body_past_the_bound_is_413(server, path):
    """Past the server's bound, whatever the handler: it names the configured limit, which
    the body is past too."""
    data = request("POST", path, {"Transfer-Encoding": "chunked", "Content-Type": "application/json"},
                   chunked(BOUND + 65536))
    (answer,) = parse(exchange(server.port, data))
    assert_too_large(answer, 413, f"Request body is larger than {MAX_BODY} bytes")


def test_a_chunked_body_over_the_limit_to_login_is_the_handlers_413(server):
    """Under the bound, a handler that takes a body reads it to the end and answers itself;
    the connection stays usable."""
    data = request("POST", "/_matrix/client/v3/login", {"Transfer-Encoding": "chunked"}, chunked(MAX_BODY + 1))
    data += request("GET", "/_matrix/client/versions", {"Connection": "close"})
    first, second = parse(exchange(server.port, data))
    assert_too_large(first, 413, f"Request body is larger than {MAX_BODY} bytes")
    assert second[0] == 200


@pytest.mark.parametrize("path", ["/_matrix/client/v3/login", "/_matrix/client/versions"])
def test_a_declared_length_past_the_bound_is_413_at_once(server, path):
    (answer,) = parse(exchange(server.port, request("POST", path, {"Content-Length": str(BOUND + 1)})))
    assert_too_large(answer, 413, f"Request body is larger than {MAX_BODY} bytes")


def test_each_refusal_has_its_access_line_and_the_server_serves_on(server):
    data = request("GET", "/_matrix/client/versions", {"X-Big": "a" * (HEAD_LIMIT + 1)})
    (refused,) = parse(exchange(server.port, data))
    data = request("POST", "/_matrix/client/versions", {"Content-Length": str(BOUND + 1)})
    (too_big,) = parse(exchange(server.port, data))
    (served,) = parse(exchange(server.port, request("GET", "/_matrix/client/versions", {"Connection": "close"})))
    assert served[0] == 200
    log = server.log.read_text()
    assert f"WARNING homeserver.access [{refused[1]['x-request-id']}]: 431 - - 127.0.0.1 " in log
    assert f"WARNING homeserver.access [{too_big[1]['x-request-id']}]: 413 POST /_matrix/client/versions 127.0.0.1 " in log
    assert "Traceback" not in log
