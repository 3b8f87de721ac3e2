"""A failed engine step (the executor or sampler raising) aborts the requests it ran, surfaces the error,
and leaves the engine usable: the core completed the step, no block stays referenced, later requests
generate exactly what a fresh engine generates. An ``AsyncEngine`` caller cancelled while its request
waits behind a slow step leaves no orphan request behind."""

import asyncio
import threading

import pytest

from engine_util import assert_pool_drained, greedy, run_until_done
from yoco_rs import AsyncEngine, Engine

SETTINGS = dict(max_model_len=256, num_gpu_blocks_override=64, max_num_seqs=2, max_num_batched_tokens=64)
PROMPTS = {"a": [2] + [300] * 37, "b": [2] + [301] * 21, "c": [2] + [302] * 29}


class DeviceLost(RuntimeError):
    pass


def _fail_once(monkeypatch, obj, name: str) -> list:
    """Make ``obj.name`` raise ``DeviceLost`` on its next call only; returns the call log."""
    real = getattr(obj, name)
    calls = []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise DeviceLost("device lost")
        return real(*a, **k)

    monkeypatch.setattr(obj, name, flaky)
    return calls


@pytest.fixture(scope="module")
def reference():
    """What a fresh engine generates for each prompt (greedy, 12 tokens)."""
    with Engine(**SETTINGS) as e:
        outs = e.generate(list(PROMPTS.values()), greedy(12), use_tqdm=False)
    return {rid: o.outputs[0].token_ids for rid, o in zip(PROMPTS, outs)}


@pytest.mark.parametrize("where", ["runner.execute", "sampler.sample"])
def test_a_failed_step_aborts_its_requests_and_the_engine_recovers(monkeypatch, reference, where):
    engine = Engine(**SETTINGS)
    try:
        for rid, prompt in PROMPTS.items():  # max_num_seqs=2: "c" waits
            engine.add_request(rid, prompt, greedy(12))
        engine.step()
        engine.step()
        owner, name = where.split(".")
        calls = _fail_once(monkeypatch, getattr(engine, "_" + owner), name)
        with pytest.raises(DeviceLost, match="device lost") as exc:
            engine.step()
        assert calls
        assert "'a', 'b'" in "".join(getattr(exc.value, "__notes__", []))
        engine.check_invariants()
        m = engine.get_metrics()
        assert m.num_requests_running == 0 and m.num_requests_waiting == 1  # only "c" is left
        assert m.request_success.get("abort", 0) == 2

        outs = engine.step()  # reports the aborted requests, then runs "c"
        aborted = {o.request_id: o for o in outs if o.finished}
        assert set(aborted) == {"a", "b"}
        assert all(o.outputs[0].finish_reason == "abort" for o in aborted.values())
        finals = run_until_done(engine)
        assert finals["c"].outputs[0].token_ids == reference["c"]  # the waiting request is unharmed
        assert_pool_drained(engine)

        # The same prompts again, with the prefix cache holding what was computed before the failure.
        again = engine.generate(list(PROMPTS.values()), greedy(12), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in again] == list(reference.values())
        assert_pool_drained(engine)
    finally:
        engine.close()


def test_generate_raises_the_step_error_and_the_next_generate_works(monkeypatch, reference):
    engine = Engine(**SETTINGS)
    try:
        _fail_once(monkeypatch, engine._runner, "execute")
        with pytest.raises(DeviceLost):
            engine.generate(list(PROMPTS.values()), greedy(12), use_tqdm=False)
        assert not engine.has_unfinished_requests()
        assert_pool_drained(engine)
        again = engine.generate(list(PROMPTS.values()), greedy(12), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in again] == list(reference.values())
    finally:
        engine.close()


def test_a_caller_cancelled_during_a_slow_step_leaves_no_orphan_request():
    async def main():
        async with AsyncEngine(**SETTINGS) as eng:
            real = eng._executor._runner.execute
            entered, release = threading.Event(), threading.Event()

            def gated(*a, **k):  # one slow step: the loop thread sits here until released
                if not release.is_set():
                    entered.set()
                    release.wait(30)
                return real(*a, **k)

            eng._executor._runner.execute = gated
            a = await eng.add_request([2, 60, 61], greedy(8), request_id="a")
            await asyncio.to_thread(entered.wait, 30)
            task = asyncio.create_task(eng.generate([2] + [62] * 40, greedy(200), request_id="b"))
            await asyncio.sleep(0.05)  # "b" is submitted, queued behind the slow step
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            release.set()
            last = [o async for o in a][-1]
            for _ in range(500):
                m = eng.get_metrics()
                if m.request_success.get("abort", 0) and m.num_requests_running + m.num_requests_waiting == 0:
                    break
                await asyncio.sleep(0.01)
            return last, m, eng.num_unfinished_requests

    last, m, unfinished = asyncio.run(asyncio.wait_for(main(), 120))
    assert last.finished and len(last.outputs[0].token_ids) == 8
    assert unfinished == 0
    assert m.request_success.get("abort", 0) == 1 and m.request_success.get("length", 0) == 1
    assert m.kv_blocks_used == 0 and m.num_requests_running == 0 and m.num_requests_waiting == 0
