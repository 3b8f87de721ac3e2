"""AsyncEngine: streaming from an asyncio loop that never blocks on a forward, aborts (explicit and by
closing the stream), validation errors at submission, readiness, death, graceful shutdown."""

import asyncio
import time

import pytest

from engine_util import greedy
from yoco_rs import AsyncEngine, EngineClosedError, EngineDeadError, Engine, RequestOutputKind, SamplingParams

SETTINGS = dict(max_model_len=256, num_gpu_blocks_override=128, max_num_seqs=8, max_num_batched_tokens=64)


def arun(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def test_stream_yields_deltas_that_add_up_to_the_sync_result():
    ref = Engine(**SETTINGS).generate([[2, 30, 31, 32]], greedy(10), use_tqdm=False)[0].outputs[0]

    async def main():
        async with AsyncEngine(**SETTINGS) as eng:
            assert eng.is_ready
            outs = [o async for o in eng.stream([2, 30, 31, 32], greedy(10, output_kind=RequestOutputKind.DELTA))]
            return outs, eng.get_metrics()

    outs, m = arun(main())
    assert sum((o.outputs[0].token_ids for o in outs), []) == ref.token_ids
    assert "".join(o.outputs[0].text for o in outs) == ref.text
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    assert m.kv_blocks_used == 0


def test_the_event_loop_keeps_running_while_the_engine_steps():
    async def main():
        async with AsyncEngine(**SETTINGS) as eng:
            ticks = 0
            stop = asyncio.Event()

            async def ticker():
                nonlocal ticks
                while not stop.is_set():
                    ticks += 1
                    await asyncio.sleep(0.001)

            t = asyncio.create_task(ticker())
            results = await asyncio.gather(*[eng.generate([2, 40 + i] * 20, greedy(20)) for i in range(6)])
            stop.set()
            await t
            return ticks, results

    ticks, results = arun(main())
    assert all(len(r.outputs[0].token_ids) == 20 for r in results)
    assert ticks > 10


def test_bad_requests_fail_at_submission_and_the_engine_lives_on():
    async def main2():
        async with AsyncEngine(**SETTINGS) as eng:
            with pytest.raises(ValueError, match="maximum context length"):
                await eng.add_request([2] * 300, greedy(4))
            with pytest.raises(ValueError, match="prompt is empty"):
                await eng.add_request("", greedy(4))
            s = await eng.add_request("fine", greedy(3), request_id="x")
            with pytest.raises(ValueError, match="already in use"):
                await eng.add_request("fine", greedy(3), request_id="x")
            outs = [o async for o in s]
            return outs[-1]

    last = arun(main2())
    assert last.finished and len(last.outputs[0].token_ids) == 3


def test_abort_and_closing_a_stream_free_their_blocks():
    async def main():
        async with AsyncEngine(**SETTINGS) as eng:
            a = await eng.add_request([2] + [50] * 40, greedy(100), request_id="a")
            b = await eng.add_request([2] + [51] * 40, greedy(100), request_id="b")
            await a.__anext__()
            await b.__anext__()
            assert await eng.abort("a")
            last = [o async for o in a][-1]
            assert last.outputs[0].finish_reason == "abort"
            await b.aclose()  # a client disconnecting
            assert not await eng.abort("nope")
            for _ in range(200):
                m = eng.get_metrics()
                if m.kv_blocks_used == 0 and m.num_requests_running == 0:
                    return m
                await asyncio.sleep(0.01)
            return eng.get_metrics()

    m = arun(main())
    assert m.kv_blocks_used == 0 and m.request_success["abort"] == 2


def test_shutdown_drains_in_flight_requests_then_refuses_new_ones():
    async def main():
        eng = await AsyncEngine.create(**SETTINGS)
        task = asyncio.create_task(eng.generate([2, 60, 61], greedy(15)))
        await asyncio.sleep(0.05)
        await eng.shutdown(drain_timeout=60)
        out = await task
        with pytest.raises(EngineClosedError):
            await eng.add_request("late", greedy(2))
        return out, eng

    out, eng = arun(main())
    assert out.finished and out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 15
    assert not eng.is_ready


def test_shutdown_with_zero_timeout_aborts_what_runs():
    async def main():
        eng = await AsyncEngine.create(**SETTINGS)
        s = await eng.add_request([2, 60, 61], greedy(200))
        await s.__anext__()
        await eng.shutdown(drain_timeout=0)
        return [o async for o in s][-1]

    last = arun(main())
    assert last.outputs[0].finish_reason == "abort"


def test_a_failed_load_makes_the_engine_dead_with_the_cause():
    async def main():
        eng = AsyncEngine(max_model_len=10 ** 6)
        with pytest.raises(EngineDeadError) as e:
            await eng.wait_ready()
        assert eng.is_dead and not eng.is_ready
        assert "max_model_len" in str(e.value.__cause__)
        with pytest.raises(EngineDeadError):
            await eng.check_health()

    arun(main())


def test_with_k_1_a_step_failure_kills_the_engine_and_fails_streams():
    # One failing step alone is contained (tests/test_engine_containment.py); with
    # max_consecutive_step_failures=1 it is fatal.
    async def main():
        eng = await AsyncEngine.create(max_consecutive_step_failures=1, **SETTINGS)

        def boom(*a, **k):
            raise RuntimeError("device lost")

        eng._executor._runner.execute = boom
        with pytest.raises(EngineDeadError, match="device lost"):
            async for _ in eng.stream("hi", greedy(3)):
                pass
        assert eng.is_dead
        with pytest.raises(EngineDeadError):
            await eng.add_request("again", greedy(2))

    arun(main())
