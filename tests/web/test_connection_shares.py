"""The web workers' shared count of open connections (alwayson/web/serving.py's Shares), by
which a worker leaves a new connection to one holding fewer: a worker that is gone, or
stopping, holds no one back. The spreading itself, across real workers:
tests/processes/test_web_server.py."""

import subprocess
import sys

from alwayson.web.serving import Shares


def test_a_worker_gone_without_clearing_its_share_holds_no_one_back():
    shares = Shares()
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    shares.ENTRY.pack_into(shares.memory, shares.offset(1), gone.pid, 0)  # killed, say
    shares.publish(2, 3)

    assert not shares.fewer_elsewhere(2, 3)
    shares.publish(1, 0)  # a live worker (this process) with fewer
    assert shares.fewer_elsewhere(2, 3)
    shares.clear(1)  # a stopping worker
    assert not shares.fewer_elsewhere(2, 3)
