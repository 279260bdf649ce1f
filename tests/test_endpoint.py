"""endpoint.path_key: what counts as the same network path, and that no secret is in it."""

from __future__ import annotations

from typing import Any

from ipy_ctxrecovery.session.endpoint import path_key


class _Fake:
    """Only what path_key reads: ``client.base_url`` and ``emulator``."""

    def __init__(self, url: str | None, emulator: Any = None, api_key: str | None = None) -> None:
        if url is not None:
            self.client = type("Client", (), {"base_url": url, "api_key": api_key})()
        self.emulator = emulator


def _Provider(url: str | None, emulator: Any = None,  # noqa: N802 - reads as a type
              api_key: str | None = None) -> Any:
    return _Fake(url, emulator, api_key)


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


def test_a_key_in_the_path_is_never_part_of_the_key() -> None:
    # What learned.json stores per path: a gateway's key in the path is masked, whether in a
    # known format or the client's own key in none.
    known = path_key(_Provider("https://gw.example/key/sk-proj-Abc123def456ghi789jkl/v1"))
    own = path_key(_Provider("https://gw.example/t/gw7Team42Key0f9e/v1", api_key="gw7Team42Key0f9e"))
    assert known == "https://gw.example/key/[REDACTED]/v1"
    assert own == "https://gw.example/t/[REDACTED]/v1"
    # A path of ordinary words stays as it is.
    assert path_key(_Provider("https://gw.example/openai/deployments/gpt-4o-mini")) == \
        "https://gw.example/openai/deployments/gpt-4o-mini"
