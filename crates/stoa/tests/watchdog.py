"""The hang watchdog of the model checks (fsx.py, nsx.py)."""
import os
import threading
import time


def start(seed, progress, log, limit=60):
    """Exits the process with status 2 when progress[0] (the operation's number) stays
    the same for `limit` seconds: one operation hangs."""
    def watch():
        last, since = -1, time.time()
        while True:
            time.sleep(1)
            if progress[0] != last:
                last, since = progress[0], time.time()
            elif time.time() - since > limit:
                print("HUNG seed=%d op#%d: %s" % (seed, progress[0], log[-3:]), flush=True)
                os._exit(2)

    threading.Thread(target=watch, daemon=True).start()
