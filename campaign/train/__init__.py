"""The built-in distributed trainer: `python -m campaign.train --config FILE`.

FILE is a JSON `TrainerConfig` (campaign/train/config.py). The trainer honours the trainer
contract (docs/trainer-contract.md; writers and readers in campaign.report). Modules:

- config.py       pydantic models (imports only pydantic)
- dist.py         the one reader of the distributed environment; init and teardown
- model.py        single-device GPT decoder and the named shapes
- parallelize.py  activation checkpointing, compile, DDP/FSDP2, in that order
- data.py         seeded synthetic Markov chain / token-file sampler; prepare_text
- checkpoint.py   DCP checkpoints with meta.json and .complete; resume with fallback
- loop.py         build and the training loop
- faults.py       fault injection for tests and drills
- signals.py      SIGTERM -> exit 143 at the next step boundary, never hang; SIGUSR1 -> rescue
- rescue.py       after a peer's crash or hang, one DDP replica saves the last finished step
- flops.py        MFU

This package's __init__ imports nothing heavy: `import campaign.train` does not import torch.
"""
