"""A screenshot of a run's TensorBoard first page (CUSTOM SCALARS), taken with headless Chromium.

    python scripts/tensorboard_screenshot.py outputs/grpo/<run> docs/tensorboard.png

Starts `tensorboard --logdir <run>/tensorboard` on a free localhost port, waits until the run's
scalars are served, lets Debian's chromium (`apt-get install chromium`) render the page and checks
that the picture is not blank (exit 1 if it is). Stops the server.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(logdir: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
                             "--port", str(port), "--load_fast", "false", "--reload_interval", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as r:
                if any("eval/accuracy/easy" in tags for tags in json.loads(r.read()).values()):
                    return proc, port
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"tensorboard never served the scalars of {logdir}")


def blank(png: Path) -> bool:
    """One colour over 98% of the picture or more."""
    import matplotlib.image
    import numpy as np

    pixels = (matplotlib.image.imread(png)[..., :3].reshape(-1, 3) * 255).astype("uint8")
    _, counts = np.unique(pixels, axis=0, return_counts=True)
    return counts.max() > 0.98 * len(pixels)


def screenshot(run: Path, png: Path, size: str = "1400,1000") -> Path:
    proc, port = serve(run / "tensorboard")
    try:
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
                            "--virtual-time-budget=20000", f"--screenshot={png.resolve()}",
                            f"http://127.0.0.1:{port}/?darkMode=false#custom_scalars"],
                           check=True, capture_output=True, timeout=180)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    if blank(png):
        raise SystemExit(f"{png}: the screenshot is blank")
    return png


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        raise SystemExit(__doc__)
    print(screenshot(Path(sys.argv[1]), Path(sys.argv[2])))
