"""experiments/runner.py: the seed's critic warm-up is made by one process at a time (an flock on a
file beside its folder), and a warm-up finished while a process waited is not made again."""

import fcntl
import os
import subprocess
import sys
import threading

from experiments.runner import claim_warmup, warmup_done


def _finish(d):
    (d / "model" / "critic").mkdir(parents=True)
    (d / "warmup.json").write_text("{}\n")


def test_the_first_process_takes_the_warm_up_and_a_finished_one_is_not_taken(tmp_path):
    d = tmp_path / "warmups" / "cell" / "seed=0"
    with claim_warmup(d, poll=0.01) as mine:
        assert mine
        assert (d.parent / "seed=0.lock").read_text() == str(os.getpid())
        _finish(d)
    assert warmup_done(d)
    with claim_warmup(d, poll=0.01) as mine:
        assert not mine


def test_a_second_process_waits_for_the_warm_up_another_is_making(tmp_path, capsys):
    """Another holder (its own open file: flock locks are per open file) makes the warm-up and lets
    go after 0.3 s; the waiter then finds it made, under the lock, and does not make it again."""
    d = tmp_path / "seed=1"
    other = open(tmp_path / "seed=1.lock", "a+")
    fcntl.flock(other, fcntl.LOCK_EX)
    other.write("4242")
    other.flush()

    def finish_and_release():
        _finish(d)
        fcntl.flock(other, fcntl.LOCK_UN)

    timer = threading.Timer(0.3, finish_and_release)
    timer.start()
    with claim_warmup(d, poll=0.02) as mine:
        assert not mine
    timer.join()
    other.close()
    out = capsys.readouterr().out
    assert out.count("waiting for the warm-up that process 4242 is making") == 1


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    """A process that took the lock and died (without unlocking) leaves it free: the kernel lets go."""
    d = tmp_path / "seed=2"
    lock = tmp_path / "seed=2.lock"
    code = f"import fcntl; f = open({str(lock)!r}, 'a+'); fcntl.flock(f, fcntl.LOCK_EX); f.write('999'); f.flush()"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert lock.read_text() == "999"
    with claim_warmup(d, poll=0.01) as mine:
        assert mine and lock.read_text() == str(os.getpid())
