"""endpoint.path_key: what counts as the same network path, and that no secret is in it."""

from __future__ import annotations

from typing import Any

from ipy_ctxrecovery.session.endpoint import path_key


class _Fake:
    """Only what path_key reads: ``client.base_url`` and ``emulator``."""

    def __init__(self, url: str | None, emulator: Any = None) -> None:
        if url is not None:
            self.client = type("Client", (), {"base_url": url})()
        self.emulator = emulator


def _Provider(url: str | None, emulator: Any = None) -> Any:  # noqa: N802 - reads as a type
    return _Fake(url, emulator)


class _Emu:
    pass


def test_path_key_drops_user_info_query_and_fragment() -> None:
    key = path_key(_Provider("https://me:sk-SECRET@proxy.example:8443/v1/?token=abc#f"))
    assert key == "https://proxy.example:8443/v1"
    assert path_key(_Provider("https://proxy.example:8443/v1")) == key


def test_an_emulator_object_is_its_own_path() -> None:
    a, b = _Emu(), _Emu()
    url = "http://127.0.0.1:5000/v1"
    assert path_key(_Provider(url, a)) == path_key(_Provider(url, a))
    assert path_key(_Provider(url, a)) != path_key(_Provider(url, b))  # a restart: new path
    assert path_key(_Provider(url, a)) != path_key(_Provider(url))


def test_no_base_url_or_an_unreferenceable_emulator_is_no_known_path() -> None:
    assert path_key(_Provider(None)) is None
    assert path_key(_Provider("http://127.0.0.1:5000/v1", emulator=3)) is None
