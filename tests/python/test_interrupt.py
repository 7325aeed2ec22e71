"""test_interrupt: Ctrl-C (SIGINT) during long library calls. A C call is
not cancelled: it finishes, and Python raises KeyboardInterrupt as soon as
it returns, so the interpreter never hangs and the call's result is whole.
Each case runs in a fresh interpreter that signals "started" and is then
sent SIGINT; it must exit with KeyboardInterrupt within the timeout.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

TIMEOUT = 120

CASES = {
    # a loop of one-shot calls, each a fraction of a second
    "numpy_forward": """
        import numpy as np, fmha
        rng = np.random.default_rng(0)
        q = rng.uniform(-1, 1, (1, 1024, 4, 64)).astype(np.float32)
        print("started", flush=True)
        while True:
            fmha.attention(q, q, q, is_causal=True, strategy="portable")
    """,
    # the backward, through a cached plan
    "numpy_backward": """
        import numpy as np, fmha
        rng = np.random.default_rng(0)
        q = rng.uniform(-1, 1, (1, 512, 4, 64)).astype(np.float32)
        o, lse = fmha.attention(q, q, q, return_lse=True)
        print("started", flush=True)
        while True:
            fmha.attention_backward(q, q, q, o, lse, o)
    """,
}


# A process started with SIGINT ignored (a background job of a
# non-interactive shell, as CI may run the tests) passes that on, and Python
# then installs no handler of its own: each case installs Python's.
PROLOGUE = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


@pytest.mark.parametrize("case", sorted(CASES))
def test_sigint_during_calls_raises_keyboard_interrupt(case):
    env = dict(os.environ, FMHA_NUM_THREADS="2")
    proc = subprocess.Popen([sys.executable, "-c", PROLOGUE + textwrap.dedent(CASES[case])], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "started", proc.stderr.read()
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{case}: still running {TIMEOUT} s after SIGINT")
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err, err[-2000:]
