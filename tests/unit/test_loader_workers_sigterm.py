"""A rank's DataLoader workers outlive a SIGTERM to the rank's process group (torchrun and a pod's
stop signal the whole group): the rank must still get its next batch to agree on a step and save
(scalelab.requeue). Before, a worker died of it and the next batch raised "DataLoader worker
(pid(s) ...) exited unexpectedly"."""
import os
import signal
import time

from scalelab.data.datamodule import ByteCorpusDataModule
from scalelab.data.prepare import prepare


def test_workers_ignore_sigterm_and_the_next_batch_comes(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_bytes(bytes(range(32, 127)) * 40)
    prepared = prepare({"source": "files", "files": [str(text)], "val_fraction": 0.0}, 16, tmp_path / "cache",
                       progress=False)
    dm = ByteCorpusDataModule(prepared, 4, 4, 0, 1, seed=1, num_workers=2)
    dm.setup()
    it = iter(dm._loader(dm.train_ds, shuffle=True))
    # batches come from the workers in turn: after two, both have started (a SIGTERM during a
    # worker's start, before its init, still kills it, as it would any process then)
    next(it), next(it)
    workers = [w.pid for w in it._workers]
    for pid in workers:   # as os.killpg(rank, SIGTERM) reaches them
        os.kill(pid, signal.SIGTERM)
    time.sleep(0.5)
    for _ in range(4):
        assert next(it).shape == (4, 17)
    del it
