"""A real TRL GRPO run on CPU, two steps, for the discover tests: a tiny random Llama with
the tiny BPE tokenizer (``rlprobe_nb.demo.tiny``), 8 arithmetic prompts as chat messages,
a reward that varies within each group (so the weights move), beta 0.04 (a reference and a
logged KL), completions logged to parquet, a checkpoint at every step; full weights into
ROOT/full, a LoRA adapter into ROOT/lora. Run in its own process (TRL imports a lot):

    python tests/byo_grpo.py ROOT
"""

import sys
from pathlib import Path

import torch

from rlprobe_nb.demo.tiny import tiny_llama, tiny_tokenizer
from rlprobe_nb.suite.prompting import user_message

PROBLEMS = [(f"What is ${i} + {i + 1}$?", str(2 * i + 1)) for i in range(8)]


def variety(completions, **kw):
    """Distinct characters of each completion: differs between the samples of a group."""
    return [float(len(set(c[0]["content"]))) for c in completions]


def grpo(out: Path, init: Path, tok, lora: bool) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": user_message(p)}],
                               "answer": a} for p, a in PROBLEMS])
    cfg = GRPOConfig(output_dir=str(out), max_steps=2, save_steps=1, logging_steps=1,
                     per_device_train_batch_size=4, num_generations=2, max_completion_length=8,
                     beta=0.04, temperature=1.0, log_completions=True, use_cpu=True,
                     report_to=[], learning_rate=1e-2, seed=0, save_only_model=True,
                     dataloader_num_workers=0)
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                 task_type="CAUSAL_LM")
    GRPOTrainer(model=str(init), reward_funcs=variety, args=cfg, train_dataset=data,
                processing_class=tok, peft_config=peft_config).train()


def main(root: Path) -> None:
    torch.set_num_threads(1)
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), hidden=32)
    for cfg in (model.config, model.generation_config):
        cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id = \
            tok.pad_token_id, tok.eos_token_id, tok.bos_token_id
    init = root / "init"
    model.save_pretrained(init)
    tok.save_pretrained(init)
    grpo(root / "full", init, tok, lora=False)
    grpo(root / "lora", init, tok, lora=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
