"""The 2-process CPU job (gloo) that writes real sharded checkpoints for the discover tests:
verl's FSDP2 and FSDP1 shard files (``model_world_size_2_rank_R.pt`` of the sharded state
dict), FSDP2 shards of a PEFT LoRA model, and torch distributed checkpoints as accelerate
(``{"model": sd}`` under ``pytorch_model_fsdp_0/``) and NeMo-RL (``policy/weights``) save them.

    python tests/byo_shards.py ROOT PORT

ROOT holds ``ref/`` (config), ``truth/step_1.safetensors`` (the checkpoint's weights) and
``truth/lora_full.safetensors`` (a PEFT model's whole state dict); each rank loads them,
shards, saves. Run as a script: ``torch.multiprocessing.spawn`` re-imports this file.
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _model(root: Path, truth: str):
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(root / "ref"))
    model.load_state_dict(load_file(root / "truth" / truth), strict=False)
    return model


def _lora_model(root: Path):
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    model = get_peft_model(_model(root, "step_1.safetensors"), LoraConfig(**LORA))
    model.load_state_dict(load_file(root / "truth" / "lora_full.safetensors"))
    return model


def _fsdp2(model, mesh):
    from torch.distributed.fsdp import fully_shard

    layers = model.get_base_model().model.layers if hasattr(model, "get_base_model") \
        else model.model.layers
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp1_state(model, mesh):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardedStateDictConfig, StateDictType

    wrapped = FSDP(model, device_mesh=mesh, use_orig_params=True, device_id=torch.device("cpu"))
    with FSDP.state_dict_type(wrapped, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig()):
        return wrapped.state_dict()


def work(rank: int, root: str, port: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    root = Path(root)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("fsdp",))
    name = f"model_world_size_2_rank_{rank}.pt"
    out = root / "shards"
    for folder in ("fsdp2", "fsdp1", "lora"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    model = _fsdp2(_model(root, "step_1.safetensors"), mesh)
    torch.save(model.state_dict(), out / "fsdp2" / name)
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(out / "dcp"))
    torch.save(_fsdp1_state(_model(root, "step_1.safetensors"), mesh), out / "fsdp1" / name)
    torch.save(_fsdp2(_lora_model(root), mesh).state_dict(), out / "lora" / name)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    mp.spawn(work, args=(sys.argv[1], int(sys.argv[2])), nprocs=2)
