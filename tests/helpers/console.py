"""Console scripts run as a user types them, and what a user must see when one meets a mistake."""
import os
import subprocess
import sys


def run(command, *args, cwd, timeout=300):
    """A console script of this environment, as a user types it: (exit code, stdout + stderr)."""
    exe = os.path.join(os.path.dirname(sys.executable), command)
    proc = subprocess.run([exe, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout + proc.stderr


def error_lines(text):
    """The ERROR lines, less hb_mapper's closing "exception in command" and a logged "ERROR Hint:"."""
    return [line for line in text.splitlines()
            if "ERROR" in line and "exception in command" not in line and "ERROR Hint: " not in line]


def assert_one_clear_error(code, text, *words):
    assert code == 1, text
    assert "Traceback" not in text and "internal error" not in text, text
    errors = error_lines(text)
    assert len(errors) == 1, text
    for w in words:
        assert w in errors[0], errors[0]
