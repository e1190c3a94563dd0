"""``fairseq-train`` (fairseq's own ``cli_main``) in a process of ``torchrun``, recording on this rank, before every
update, the relative encodings' parameters ``…relative.<name>`` of the names given (``r1,r2``) and who holds them:
whether each is the object fairseq's DDP wrapper reduces (torch's ``DistributedDataParallel._module_parameters``)
and the object its optimizer updates.  Usage (the record of rank R goes to ``PREFIX.rank<R>.pt``)::

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/train_recording_ranks.py PREFIX r1,r2 DATA FLAGS...

The record (a list, one entry per update): ``{"values": {name: tensor}, "ddp": bool, "optimizer": bool}``.
"""

import os
import sys

import torch
from fairseq.trainer import Trainer
from fairseq_cli import train


def main():
    prefix, names = sys.argv.pop(1), tuple(f"relative.{n}" for n in sys.argv.pop(1).split(","))
    records = []
    original = Trainer.train_step

    def train_step(self, samples, *args, **kwargs):
        params = {n: p for n, p in self._model.named_parameters() if n.endswith(names)}
        ddp = self.model.module if hasattr(self.model, "module") else None  # fairseq's ModuleProxyWrapper → DDP
        reduced = {id(p) for p in getattr(ddp, "_module_parameters", ())}
        updated = {id(p) for p in self.optimizer.params}
        records.append({"values": {n: p.detach().clone() for n, p in params.items()},
                        "ddp": ddp is not None and all(id(p) in reduced for p in params.values()),
                        "optimizer": all(id(p) in updated for p in params.values())})
        return original(self, samples, *args, **kwargs)

    Trainer.train_step = train_step
    try:
        train.cli_main()
    finally:
        torch.save(records, f"{prefix}.rank{os.environ.get('RANK', '0')}.pt")


if __name__ == "__main__":
    main()
