"""Compiled steps built beside a running server (serve/building.py): the build runs in a process of its
own, ``/health`` says ``compiling`` meanwhile, and the log says how it ended: built, or why not (the
model's own steps then go on serving). The real build, through a server, is in
tests/serve/test_continuous_server.py."""

import logging
import time

from attnkit.serve.building import StepsBuilding
from attnkit.serve.state import ServerState, ServeSettings


def _builds() -> None:
    time.sleep(0.5)


def _fails() -> None:
    raise RuntimeError("no room left on the device")


def _hangs() -> None:
    time.sleep(600)


class _Served:
    def steps(self) -> str:
        return "eager"


def test_a_build_is_compiling_on_health_until_it_ends_and_the_log_says_so(caplog):
    caplog.set_level(logging.INFO, logger="uvicorn.error")
    server = ServerState(ServeSettings(), model=_Served())
    server.building = StepsBuilding(_builds)
    assert server.steps() == "compiling" and "building the compiled decoding steps" in caplog.text
    server.building.waiting.join(60)
    assert server.steps() == "eager" and server.building.failed is None  # (the model says what it has)
    assert "the compiled decoding steps are built" in caplog.text


def test_a_build_that_fails_is_logged_with_why_and_the_models_own_steps_serve(caplog):
    building = StepsBuilding(_fails)
    building.waiting.join(60)
    assert not building.building and building.failed == "RuntimeError: no room left on the device"
    assert (
        "could not be built (RuntimeError: no room left on the device); the model's own steps" in caplog.text
    )


def test_a_build_still_running_when_the_server_stops_is_ended_without_a_warning(caplog):
    building = StepsBuilding(_hangs)
    began = time.monotonic()
    building.stop()
    assert not building.process.is_alive() and time.monotonic() - began < 10
    building.waiting.join(10)
    assert not building.building and "without a word" in building.failed
    assert "could not be built" not in caplog.text


def test_a_build_that_cannot_start_leaves_the_server_serving(run, monkeypatch, caplog):
    """Whatever goes wrong in starting the build (here: the builder raises), the server serves with the
    model's own steps and the log says why; a server stuck at "loading" would serve nothing."""
    from fastapi.testclient import TestClient

    from attnkit.serve.app import make_app
    from attnkit.serve.translator import ServedTranslator

    def no_builder(self, warn):
        raise OSError("no processes left")

    monkeypatch.setattr(ServedTranslator, "steps_builder", no_builder)
    settings = ServeSettings(batching="continuous", workers="threads")
    with TestClient(make_app(ServedTranslator, lambda: ServedTranslator.load(run, []), settings)) as client:
        deadline = time.monotonic() + 60
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, client.get("/health").json()
            time.sleep(0.05)
        assert client.post("/translator/translate", json=[{"src": "12 May 2020"}]).status_code == 200
    assert "the compiled steps' build could not start (OSError: no processes left)" in caplog.text


def test_the_build_goes_on_until_greedy_searchs_steps_are_built_whatever_the_runs_beam(run, monkeypatch):
    """A request may ask for a beam of one whatever the run's beam (a greedy request took the model's
    own steps, twice as slow, where only the run's beam's were built): ``decode.steps=auto`` builds
    until the first step, the run's beam's and greedy search's are built, and with drafts greedy
    search's check step too. Which steps are built is faked here; the real build is in
    tests/serve/test_continuous_server.py."""
    from attnkit.cpu.compiled.build import CHECK_STEP, FIRST_STEP
    from attnkit.serve import translator

    built: set[int] = set()
    monkeypatch.setattr(translator, "all_built", lambda model, widths, fingerprint=None: set(widths) <= built)
    monkeypatch.setattr(translator, "missing_compiler", lambda: None)
    plain = translator.ServedTranslator.load(run, ["decode.steps=auto", "decode.beam_size=4"])
    drafting = translator.ServedTranslator.load(
        run, ["decode.steps=auto", "decode.beam_size=4", "decode.speculative=source"]
    )
    assert plain.steps_builder(print) is not None
    built |= {FIRST_STEP, 4}
    assert plain.steps() == "compiled" and plain.steps_builder(print) is not None
    built.add(1)
    assert plain.steps_builder(print) is None and drafting.steps_builder(print) is not None
    built.add(CHECK_STEP)
    assert drafting.steps_builder(print) is None
