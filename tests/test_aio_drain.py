"""The aio sender's drain (loadgen/aio_sender.py, `drain`): at its end every request in flight is
reported once, whole if it ended as the wait did, cut off if it was still streaming."""

import asyncio

from loadgen.aio_sender import drain
from loadgen.targets.client import CUT_OFF, StreamResult


def test_a_request_that_ends_as_the_drain_does_is_whole_and_reported_once():
    async def main():
        loop = asyncio.get_running_loop()
        tasks, reported = {}, []

        def done(task):
            reported.append(vars(tasks.pop(task)))

        async def stream(ends_s):
            ending = loop.create_future()
            loop.call_later(ends_s, ending.set_result, None)
            await ending

        # three end on the drain's own deadline (the same loop turn as its timeout), one later
        for i, ends_s in enumerate((0.05, 0.05, 0.05, 5.0)):
            task = asyncio.create_task(stream(ends_s))
            tasks[task] = StreamResult(f"r{i}", 0)
            task.add_done_callback(done)
        await asyncio.sleep(0)
        await drain(tasks, done, 0.05, reported.append)
        await asyncio.sleep(0.01)  # any callback left would report twice, or raise
        return reported, tasks

    reported, left = asyncio.run(main())
    assert sorted((r["request_id"], r["status"]) for r in reported) == [
        ("r0", "OK"), ("r1", "OK"), ("r2", "OK"), ("r3", CUT_OFF)]
    assert left == {}


def test_the_sender_runs_on_uvloop_only_past_its_spin_rate():
    from loadgen.aio_sender import SPIN_RATE, fast

    def job(rate: float, workers: int = 1) -> dict:
        return {"config": {"rate": rate}, "workers": workers}

    assert not fast(job(4)) and not fast(job(SPIN_RATE))
    assert fast(job(SPIN_RATE * 2)) and not fast(job(SPIN_RATE * 2, workers=2))
