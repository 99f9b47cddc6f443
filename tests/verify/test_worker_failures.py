"""Verifier workers are capo's own interpreters: what they import, and what happens when one dies or cannot start.

A worker that dies mid-item is replaced and the item retried (a dead worker never costs a verdict); an item that
kills every worker it meets is TIMEOUT after ``max_retries`` retries; a worker that cannot start is retried and then
reported with its own exception; a task that raises is reported with its traceback, never guessed at.
"""

import os
import re
import signal
import sys
import threading
import time

import pytest

from capo.verify import Verdict, Verifier, WorkerError
from capo.verify import _worker


@pytest.fixture()
def one():
    with Verifier(workers=1, timeout_s=3.0) as v:
        yield v


def test_worker_imports_neither_the_callers_modules_nor_torch(one):
    import torch  # noqa: F401  - the caller has torch, as a training script does

    assert "torch" in sys.modules
    assert one._run_tasks([(_worker.imported_task, "torch"), (_worker.imported_task, "math_verify"),
                           (_worker.imported_task, "test_worker_failures")], on_timeout="timeout") == ["no", "yes", "no"]


def test_a_worker_starts_with_nothing_on_its_stderr():
    """Its stderr is kept for error reports: a plain start must leave it empty. Launched as ``-m
    capo.verify._worker`` it held runpy's RuntimeWarning (the package imports the module before runpy runs it as
    __main__), which then headed every worker error report."""
    import subprocess

    from capo.verify._pool import _command

    cmd, env = _command(None)
    p = subprocess.run(cmd, env=env, input=b'{"fn": "ping", "args": []}\n', capture_output=True, timeout=60)
    assert p.returncode == 0 and p.stderr.decode() == ""
    assert p.stdout.decode().splitlines() == ['{"ready": true}', '{"result": true}']


def test_worker_runs_the_same_capo_as_the_caller(one):
    import capo

    (worker_capo,) = one._run_tasks([(_worker.module_file_task, "capo")], "timeout")
    assert os.path.realpath(worker_capo) == os.path.realpath(capo.__file__)


def test_worker_dying_mid_item_is_replaced_and_the_item_retried(one, tmp_path):
    marker = str(tmp_path / "deaths")
    assert one._run_tasks([(_worker.die_task, marker, 1), (_worker.stall_task, 0.0)], "timeout") == \
        ["survived", "finished"]
    assert open(marker).read() == "x"  # it died exactly once
    assert one.n_killed == 1
    (report,) = one.worker_failures
    assert "died while judging die_task" in report and "exit status 3" in report
    assert "die_task: exiting on purpose" in report  # the worker's own stderr, not a guess


def test_an_item_that_kills_every_worker_is_timeout_after_the_retries(tmp_path):
    marker = str(tmp_path / "deaths")
    with Verifier(workers=1, timeout_s=3.0) as v:  # max_retries: 2 by default
        assert v._run_tasks([(_worker.die_task, marker, 99)], "timeout") == ["timeout"]
        assert open(marker).read() == "xxx"  # first try + 2 retries
        assert v.n_killed == 3 and len(v.worker_failures) == 3
        assert v.verify("1/2", "0.5") is Verdict.CORRECT  # and the verifier still works


def test_max_retries_zero_gives_up_at_the_first_death(tmp_path):
    marker = str(tmp_path / "deaths")
    with Verifier(workers=1, timeout_s=3.0, max_retries=0) as v:
        assert v._run_tasks([(_worker.die_task, marker, 99)], "timeout") == ["timeout"]
        assert open(marker).read() == "x" and v.n_killed == 1


def test_worker_killed_from_outside_mid_item_costs_no_verdict(one):
    one.verify("1/2", "0.5")  # starts and warms the worker
    (w,) = one._pool.workers

    def kill_soon():
        time.sleep(0.5)
        os.kill(w.proc.pid, signal.SIGKILL)

    th = threading.Thread(target=kill_soon)
    th.start()
    assert one._run_tasks([(_worker.stall_task, 1.5)], "timeout") == ["finished"]  # retried in a new worker
    th.join()
    assert one.n_killed == 1 and "exit status -9" in one.worker_failures[0]


def test_worker_killed_while_idle_is_replaced_before_the_next_batch(one):
    assert one.verify_batch(["1/2"], ["0.5"]) == [Verdict.CORRECT]
    (w,) = one._pool.workers
    os.kill(w.proc.pid, signal.SIGKILL)
    w.proc.wait()
    assert one.verify_batch(["1/2", r"\frac{1}{3}"], ["0.5", "0.25"]) == [Verdict.CORRECT, Verdict.INCORRECT]
    assert one.n_killed == 1 and "died while idle" in one.worker_failures[0]


def test_worker_that_cannot_start_is_reported_with_its_own_exception(tmp_path, monkeypatch):
    # a math_verify that fails to import, first on the workers' path: every start fails the same way
    (tmp_path / "math_verify.py").write_text("raise ImportError('broken on purpose')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    with Verifier(workers=1, startup_timeout_s=60) as v:
        with pytest.raises(WorkerError) as e:
            v.verify_batch(["1/2"], ["0.5"])
        assert v._pool.n_started == 3
        with pytest.raises(WorkerError, match="3 verifier worker starts failed in a row"):  # the count starts again
            v.verify_batch(["1/2"], ["0.5"])
        assert v._pool.n_started == 6
    msg = str(e.value)
    assert "a verifier worker could not start: ImportError: broken on purpose" in msg
    assert "3 verifier worker starts failed in a row" in msg
    assert "Traceback" in msg and "math_verify.py" in msg  # the worker's own traceback tail


@pytest.mark.parametrize("stderr, shown", [(b"dying on purpose \xff\n", "dying on purpose \ufffd\n"),
                                           (b"", "(nothing)")],
                         ids=["undecodable", "empty"])  # undecodable bytes replaced; an empty stderr named
def test_a_worker_that_dies_while_starting_is_reported_with_its_exit_status_and_stderr(tmp_path, monkeypatch,
                                                                                        stderr, shown):
    # a math_verify that ends its interpreter on import, without a report on the protocol pipe
    (tmp_path / "math_verify.py").write_text(f"import os, sys\nsys.stderr.buffer.write({stderr!r})\n"
                                             "sys.stderr.flush()\nos._exit(5)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")  # nothing else on the workers' stderr: the report holds all of it
    with Verifier(workers=1, startup_timeout_s=60) as v:
        with pytest.raises(WorkerError) as e:
            v.verify_batch(["1/2"], ["0.5"])
        assert v._pool.n_started == 3
    assert str(e.value) == ("a verifier worker died while starting (exit status 5); its stderr ends with:\n"
                            f"{shown}\n(3 verifier worker starts failed in a row)")


def test_memory_bound_applies_before_math_verify_loads():
    # 1 MB above a bare interpreter cannot hold math-verify's imports. Where the allocation fails decides how the
    # worker reports it (MemoryError or SystemError from Python, or a fatal error on stderr): every start fails.
    with Verifier(workers=1, memory_limit_mb=1, startup_timeout_s=60) as v:
        with pytest.raises(WorkerError, match="3 verifier worker starts failed in a row") as e:
            v.verify_batch(["1/2"], ["0.5"])
        assert v._pool.n_started == 3
    assert re.search(r"could not start: (MemoryError|SystemError)|died while starting", str(e.value))


def test_a_task_that_raises_is_an_error_with_its_traceback(one):
    with pytest.raises(WorkerError, match=r"(?s)verify_task failed: TypeError.*Traceback"):
        one._run_tasks([(_worker.verify_task, "1")], "timeout")  # missing arguments
    assert one.verify("2", "2.0") is Verdict.CORRECT  # the worker lives on


def test_an_error_mid_batch_leaves_no_item_of_it_in_flight():
    with Verifier(workers=2, timeout_s=3.0) as v:
        v.verify_batch(["1/2", "1/3"], ["0.5", "0.5"])  # both workers warm
        with pytest.raises(WorkerError):  # one worker fails at once while the other is still judging its item
            v._run_tasks([(_worker.stall_task, 1.0), (_worker.verify_task, "1")], "timeout")
        # a late reply of the abandoned item must not become a verdict of the next batch
        time.sleep(1.2)
        assert v._run_tasks([(_worker.imported_task, "torch"), (_worker.imported_task, "sympy")], "timeout") == \
            ["no", "yes"]


def test_memory_bound_is_relative_to_the_workers_own_baseline():
    import resource

    base = _worker.address_space_bytes()
    assert base is not None and base > 0
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        limit = _worker.limit_memory(64)  # in this (test) process: its current size + 64 MB
        assert base + 64 * 2**20 <= limit <= _worker.address_space_bytes() + 64 * 2**20
        assert resource.getrlimit(resource.RLIMIT_AS)[0] == limit
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# A math_verify first on the workers' path that loads the real one and wraps its ``parse``: text containing the
# marker blocks with the soft alarm ignored (as C code stuck in sympy would), so only the parent's hard kill stops it.
STALLING_MATH_VERIFY = '''
import os, signal, sys, time
_here = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != _here]
del sys.modules["math_verify"]
import math_verify as _real
_parse = _real.parse
def parse(text, *args, **kwargs):
    if "capostall" in text:
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        time.sleep(60)
    return _parse(text, *args, **kwargs)
_real.parse = parse
sys.modules["math_verify"] = _real
'''


def test_a_verification_hard_killed_inside_verify_batch_is_timeout_and_the_others_keep_theirs(tmp_path, monkeypatch):
    (tmp_path / "math_verify.py").write_text(STALLING_MATH_VERIFY)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    C, I, U, T = Verdict.CORRECT, Verdict.INCORRECT, Verdict.UNPARSABLE, Verdict.TIMEOUT
    with Verifier(workers=1, timeout_s=3.0, startup_timeout_s=60) as v:
        preds = ["1/2", r"\capostall", r"\frac{1}{3}", None, "0.25", "7"]
        golds = ["0.5", "1", "0.5", "1", r"\frac{1}{4}", "8"]
        t = time.perf_counter()
        assert v.verify_batch(preds, golds) == [C, T, I, U, C, I]
        assert time.perf_counter() - t < 45  # the stalled item did not run its 60 s
        assert v.n_killed == 1 and v.worker_failures == []  # killed by the hard timeout, not found dead
        assert len(v.last_elapsed) == 4 and v.last_elapsed[1] >= v.timeout_s  # the 4 items sent to a worker
        # each a time since its own dispatch (the killed item's until its kill): seconds, not a clock reading
        assert v.last_elapsed[1] < 45 and all(0 < e < 45 for e in v.last_elapsed)
        assert v.verify_batch([r"\frac{2}{4}"], ["0.5"]) == [C]  # the replacement worker judges the next batch


def test_a_worker_not_ready_within_the_startup_timeout_is_a_failed_start(tmp_path, monkeypatch):
    # a math_verify whose import never finishes: each start is stopped at startup_timeout_s, killed, and reported
    (tmp_path / "math_verify.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    t = time.perf_counter()
    with Verifier(workers=1, startup_timeout_s=1.0) as v:
        with pytest.raises(WorkerError) as e:
            v.verify_batch(["1/2"], ["0.5"])
        assert v._pool.n_started == 3
    assert time.perf_counter() - t < 20  # three starts of ~1 s each, not 60 s
    msg = str(e.value)
    assert "a verifier worker was not ready within 1 s (exit status -9)" in msg  # killed before its report
    assert "3 verifier worker starts failed in a row" in msg


def test_workers_ignore_the_callers_working_directory(tmp_path, monkeypatch):
    # a module in the caller's current directory never shadows the workers' own imports (python -P)
    (tmp_path / "math_verify.py").write_text("raise ImportError('the working directory was on the path')\n")
    monkeypatch.chdir(tmp_path)
    with Verifier(workers=1, timeout_s=3.0, memory_limit_mb=None) as v:  # and no memory bound: still judged
        assert v.verify_batch([r"\frac{1}{2}", "1/3"], ["0.5", "0.5"]) == [Verdict.CORRECT, Verdict.INCORRECT]


def test_a_closed_verifier_starts_fresh_workers_when_used_again():
    v = Verifier(workers=1, timeout_s=3.0)
    assert v.verify("1/2", "0.5") is Verdict.CORRECT
    (w,) = v._pool.workers
    v.close()
    assert w.proc.poll() is not None and v._pool.workers == []  # stopped
    v.close()  # twice is fine
    assert v.verify(r"\frac{1}{3}", "0.5") is Verdict.INCORRECT and v._pool.n_started == 2
    v.close()


def test_a_worker_gone_when_given_a_task_is_replaced_and_the_task_requeued(one, monkeypatch):
    # the race between the idle check and the send: the worker dies after the pool last saw it alive
    assert one.verify("1/2", "0.5") is Verdict.CORRECT
    (w,) = one._pool.workers
    os.kill(w.proc.pid, signal.SIGKILL)
    w.proc.wait()
    monkeypatch.setattr(w.proc, "poll", lambda: None)  # still looks alive to the idle check
    assert one.verify_batch([r"\frac{1}{3}", "2/4"], ["0.5", "0.5"]) == [Verdict.INCORRECT, Verdict.CORRECT]
    assert one.n_killed == 1 and one._pool.n_started == 2
    (report,) = one.worker_failures
    assert report.startswith("a verifier worker was gone when given a task (exit status -9)")


def test_failed_starts_are_counted_from_the_last_good_start(tmp_path, monkeypatch):
    # a worker that started, then dies; its replacements cannot start: three failed starts after the good one
    with Verifier(workers=1, timeout_s=3.0, startup_timeout_s=60) as v:
        assert v.verify("1/2", "0.5") is Verdict.CORRECT
        (tmp_path / "math_verify.py").write_text("raise ImportError('broken on purpose')\n")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
        (w,) = v._pool.workers
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.wait()
        with pytest.raises(WorkerError, match="3 verifier worker starts failed in a row"):
            v.verify("1/2", "0.5")
        assert v._pool.n_started == 1 + 3


def test_the_wait_ends_at_the_items_hard_timeout_or_the_workers_startup_timeout():
    # a busy worker (item 0 counts as busy) is due timeout_s after its item was sent; a starting one
    # startup_timeout_s after it started. A deadline in the past would make the pool spin on select.
    from types import SimpleNamespace

    from capo.verify._pool import Pool

    p = Pool(1, timeout_s=3.0, memory_headroom_mb=None, startup_timeout_s=60.0)  # starts nothing
    assert p._deadline(SimpleNamespace(item=0, t_item=100.0, t_start=10.0)) == 103.0
    assert p._deadline(SimpleNamespace(item=None, t_item=0.0, t_start=10.0)) == 70.0


def test_a_reply_split_across_reads_waits_for_its_newline():
    # a pipe read can end inside a reply line: the part read so far is kept, not parsed and not dropped
    from types import SimpleNamespace

    from capo.verify._pool import _Worker

    r, wr = os.pipe()
    w = object.__new__(_Worker)  # no process: only the reply buffer and the pipe
    w._buf, w.proc = b"", SimpleNamespace(stdout=os.fdopen(r, "rb"))
    try:
        os.write(wr, b'{"result": "eq')
        assert w.replies() == []
        os.write(wr, b'ual"}\n{"ready": true}\n{"res')
        assert w.replies() == [{"result": "equal"}, {"ready": True}]
        os.write(wr, b'ult": "x"}\n')
        assert w.replies() == [{"result": "x"}]
        os.close(wr)
        assert w.replies() is None  # the worker's output ended
    finally:
        w.proc.stdout.close()


class _FakeWorker:
    """A stand-in for a worker process in the pool's bookkeeping tests (nothing is started)."""

    def __init__(self, ready=True, item=None, gone=False, dead=False):
        self.ready, self.item, self.gone, self.sent, self.killed = ready, item, gone, [], False
        code = -9 if dead else None  # a process killed from outside, or one still running
        self.proc = type("Proc", (), {"poll": staticmethod(lambda: code)})()

    def send(self, fn_name, args):
        if self.gone:
            raise BrokenPipeError
        self.sent.append((fn_name, list(args)))

    def failure(self, what, reply=None):
        return what

    def kill(self):
        self.killed = True


def test_dispatch_passes_busy_starting_and_gone_workers_to_reach_an_idle_one():
    # the gone worker's task goes back to the head of the queue and then to the next idle worker, in the same pass
    from capo.verify._pool import Pool, _Batch

    p = Pool(4, timeout_s=3.0, memory_headroom_mb=None, startup_timeout_s=60.0)
    busy, starting, gone, idle, fresh = (_FakeWorker(item=7), _FakeWorker(ready=False), _FakeWorker(gone=True),
                                         _FakeWorker(), _FakeWorker(ready=False))
    p.workers, p._start = [busy, starting, gone, idle], lambda: fresh
    b = _Batch([(_worker.stall_task, 0.0), (_worker.stall_task, 1.0)], "timeout")
    p._dispatch(b)
    assert idle.sent == [("stall_task", [0.0])] and idle.item == 0
    assert busy.sent == starting.sent == [] and list(b.pending) == [1]
    assert gone.killed and p.workers == [busy, starting, fresh, idle]
    assert p.failures == ["a verifier worker was gone when given a task"] and p.n_killed == 1


def test_an_interrupted_batch_stops_its_busy_and_starting_workers_and_keeps_the_idle_ones():
    # a late reply of a busy worker, or a starting one's, must not reach the next call; an idle warm worker is kept
    from capo.verify._pool import Pool

    p = Pool(3, timeout_s=3.0, memory_headroom_mb=None, startup_timeout_s=60.0)
    busy, starting, idle = _FakeWorker(item=0), _FakeWorker(ready=False), _FakeWorker()
    p.workers = [busy, starting, idle]

    def interrupted(b):
        raise KeyboardInterrupt

    p._dispatch = interrupted
    with pytest.raises(KeyboardInterrupt):
        p.run([(_worker.stall_task, 0.0)], "timeout")
    assert p.workers == [idle] and busy.killed and starting.killed and not idle.killed


def test_between_calls_only_a_dead_idle_warm_worker_is_replaced():
    # a dead worker still starting is left to the batch (it is a failed start there, counted as one); a live one is
    # kept; the pool is then topped up to its size
    from capo.verify._pool import Pool

    p = Pool(4, timeout_s=3.0, memory_headroom_mb=None, startup_timeout_s=60.0)
    idle_dead, starting_dead, idle = _FakeWorker(dead=True), _FakeWorker(ready=False, dead=True), _FakeWorker()
    new = [_FakeWorker(ready=False), _FakeWorker(ready=False)]
    p.workers, p._start = [idle_dead, starting_dead, idle], lambda: new.pop(0)
    p._fill()
    assert idle_dead.killed and not starting_dead.killed and not idle.killed
    assert p.workers[1:3] == [starting_dead, idle] and len(p.workers) == 4 and new == []
    assert p.failures == ["a verifier worker died while idle"] and p.n_killed == 1


def test_kills_add_to_the_count_of_earlier_batches():
    # ``n_killed`` counts every worker killed or found dead over the verifier's life: each path adds one
    from capo.verify._pool import Pool, _Batch

    p = Pool(2, timeout_s=3.0, memory_headroom_mb=None, startup_timeout_s=60.0)
    p._start = lambda: _FakeWorker(ready=False)
    p.n_killed = 5  # from earlier batches
    p.workers = [_FakeWorker(dead=True), _FakeWorker()]
    p._fill()  # found dead while idle
    assert p.n_killed == 6
    p.workers = [_FakeWorker(gone=True), _FakeWorker()]
    p._dispatch(_Batch([(_worker.stall_task, 0.0)], "timeout"))  # gone when given a task
    assert p.n_killed == 7


def test_two_items_past_the_hard_timeout_in_one_pass_kill_two_workers():
    # both busy workers are over time at the same check: each item is on_timeout with its own elapsed time, each
    # worker killed and replaced, and both kills counted
    from capo.verify._pool import Pool, _Batch

    p = Pool(3, timeout_s=3.0, memory_headroom_mb=None, startup_timeout_s=60.0)
    fresh = [_FakeWorker(ready=False), _FakeWorker(ready=False)]
    p._start = lambda: fresh.pop(0)
    now = time.monotonic()
    late0, late2, on_time = _FakeWorker(item=0), _FakeWorker(item=2), _FakeWorker(item=1)
    late0.t_item, late2.t_item, on_time.t_item = now - 10.0, now - 5.0, now
    p.workers = [late0, on_time, late2]
    b = _Batch([(_worker.stall_task, 60.0)] * 3, "timeout")
    p._enforce_deadlines(b)
    assert b.results == ["timeout", None, "timeout"] and p.n_killed == 2
    assert 10.0 <= b.elapsed[0] < 20.0 and 5.0 <= b.elapsed[2] < 15.0 and b.elapsed[1] == 0.0
    assert late0.killed and late2.killed and not on_time.killed and fresh == []
    assert p.workers[1] is on_time and all(not w.ready for w in (p.workers[0], p.workers[2]))


def test_a_death_read_in_a_wait_does_not_hold_back_the_other_workers_replies():
    # two workers readable after one wait: the first's output ended (it died mid-item), the second has its result.
    # The death is handled (item requeued, worker replaced) and the result is taken in the same pass.
    from capo.verify._pool import Pool, _Batch

    p = Pool(2, timeout_s=3.0, memory_headroom_mb=None, startup_timeout_s=60.0)
    fresh = _FakeWorker(ready=False)
    p._start = lambda: fresh
    died, answered = _FakeWorker(item=0), _FakeWorker(item=1)
    died.replies, answered.replies = (lambda: None), (lambda: [{"result": "equal"}])
    died.t_item = answered.t_item = time.monotonic()
    p.workers = [died, answered]
    b = _Batch([(_worker.stall_task, 0.0), (_worker.stall_task, 0.0)], "timeout")
    b.pending.clear()  # both dispatched
    p._collect(b, [died, answered])
    assert b.results == [None, "equal"] and answered.item is None and list(b.pending) == [0] and b.tries == [1, 0]
    assert died.killed and p.workers == [fresh, answered] and p.n_killed == 1
    assert p.failures == ["a verifier worker died while judging stall_task"]
