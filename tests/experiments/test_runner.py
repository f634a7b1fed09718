"""experiments/runner.py: the seed's critic warm-up is made by one process at a time."""

import os
import subprocess
import threading

from experiments.runner import claim_warmup, warmup_done


def _finish(d):
    (d / "model" / "critic").mkdir(parents=True)
    (d / "warmup.json").write_text("{}\n")


def test_the_first_process_takes_the_warm_up_and_a_finished_one_is_not_taken(tmp_path):
    d = tmp_path / "warmups" / "cell" / "seed=0"
    assert claim_warmup(d, poll=0.01)
    assert (d.parent / "seed=0.lock").read_text() == str(os.getpid())
    _finish(d)
    (d.parent / "seed=0.lock").unlink()
    assert warmup_done(d) and not claim_warmup(d, poll=0.01)


def test_a_second_process_waits_for_the_warm_up_another_is_making(tmp_path, capsys):
    d = tmp_path / "seed=1"
    (tmp_path / "seed=1.lock").write_text(str(os.getppid()))  # a live process holds it
    timer = threading.Timer(0.3, _finish, args=(d,))
    timer.start()
    assert not claim_warmup(d, poll=0.02)  # it waited, then found the warm-up made: nothing to do
    timer.join()
    out = capsys.readouterr().out
    assert out.count("waiting for the warm-up that process") == 1 and str(os.getppid()) in out


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    d = tmp_path / "seed=2"
    (tmp_path / "seed=2.lock").write_text(str(gone.pid))
    assert claim_warmup(d, poll=0.01)
    assert (tmp_path / "seed=2.lock").read_text() == str(os.getpid())
