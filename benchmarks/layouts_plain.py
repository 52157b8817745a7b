"""bench_layouts' baseline rows: plain DeepSpeed over the whole Hugging Face model (dp over all ranks,
or DeepSpeed's own AutoTP), trained on the same objective, samples per rank and optimizer as the
ds_hetero rows, and returning the same step record."""

from __future__ import annotations

import time
from collections import defaultdict


class PlainEngine:
    """One deepspeed.initialize over the whole HF model, trained on the same objective as ds_hetero."""

    def __init__(self, model, a, plain, config):
        import deepspeed
        import torch.distributed as dist

        from ds_hetero.topology.distributed import ensure_distributed
        from ds_hetero.families import adapter_for
        from ds_hetero.families.llava.adapter import split_llava

        self.rank, self.world = ensure_distributed(600)
        self.a, self.adapter = a, adapter_for(model)
        stages = split_llava(model)  # only to list the parameters LLaVA's forward uses (see trainable_parameters)
        params = stages["vision"].trainable_parameters() + [p for p in stages["language"].parameters()]
        self.plain = plain
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=config)
        self.dist = dist

    def train_batch(self, samples):
        import torch

        from ds_hetero.loss import label_token_count, token_loss_sum

        a, gas = self.a, self.a["micro_batches"]
        n_labels = sum(label_token_count(s["labels"]) for s in samples)
        dp = self.plain.dp(self.world)  # AutoTP: the tp ranks of a group (consecutive ranks) take the same samples
        per_rank = a["batch"] // (dp * gas)
        times = defaultdict(float)
        loss_sum = 0.0
        start = time.perf_counter()
        for m in range(gas):  # the same samples per rank and micro-batch as ds_hetero's dp4 stages
            first = m * (a["batch"] // gas) + (self.rank // self.plain.autotp) * per_rank
            mine = samples[first:first + per_rank]
            t0 = time.perf_counter()
            batch = self.adapter.language_inputs(mine)
            logits = self.engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                 position_ids=batch["position_ids"],
                                 pixel_values=self.adapter.vision_inputs(mine)["pixel_values"]).logits
            local = token_loss_sum(logits, batch["labels"])
            t1 = time.perf_counter()
            self.engine.backward(local / n_labels * (dp * gas))
            t2 = time.perf_counter()
            self.engine.step()
            t3 = time.perf_counter()
            loss_sum += float(local.detach()) / self.plain.autotp  # every tp rank computed the same loss
            times["forward"] += t1 - t0
            times["backward"] += t2 - t1
            times["step"] += t3 - t2
        loss = torch.tensor([loss_sum], dtype=torch.float64)
        self.dist.all_reduce(loss)
        return dict(loss=float(loss) / n_labels, num_tokens=n_labels, step_time=time.perf_counter() - start,
                    stage_time={"model": {"forward": times["forward"], "backward": times["backward"]},
                                "optimizer": {"step": times["step"]}},
                    boundary_bytes=0)


class PlainTwoEngines:
    """Plain DeepSpeed with the model cut into its two stage modules, one engine each (vision tower +
    projector, language model), as a user who splits the model by hand would run it: the language
    engine's backward, the rows' gradient fed to the vision engine's backward, then each engine's
    own step (each clips by its own norm). No ds_hetero step logic: no batch agreement, no plan, no
    boundary, no global norm. bench_overhead reads what a second DeepSpeed engine costs from it.
    The same samples per rank as PlainEngine (dp over all ranks)."""

    def __init__(self, model, a, plain, config):
        import deepspeed
        import torch.distributed as dist

        from ds_hetero.topology.distributed import ensure_distributed
        from ds_hetero.families import adapter_for
        from ds_hetero.families.llava.adapter import split_llava

        assert plain.autotp == 1, "the two-engine row is dp only"
        self.rank, self.world = ensure_distributed(600)
        self.a, self.adapter, self.plain = a, adapter_for(model), plain
        stages = split_llava(model)
        self.vision, *_ = deepspeed.initialize(model=stages["vision"], config=config,
                                               model_parameters=stages["vision"].trainable_parameters())
        self.language, *_ = deepspeed.initialize(model=stages["language"], config=config,
                                                 model_parameters=list(stages["language"].parameters()))
        self.dist = dist

    def train_batch(self, samples):
        import torch

        from ds_hetero.loss import label_token_count, token_loss_sum

        a, gas = self.a, self.a["micro_batches"]
        n_labels = sum(label_token_count(s["labels"]) for s in samples)
        dp = self.plain.dp(self.world)
        per_rank = a["batch"] // (dp * gas)
        loss_sum = 0.0
        start = time.perf_counter()
        for m in range(gas):
            first = m * (a["batch"] // gas) + self.rank * per_rank
            mine = samples[first:first + per_rank]
            batch = self.adapter.language_inputs(mine)
            rows = self.vision(self.adapter.vision_inputs(mine)["pixel_values"])
            leaf = rows.detach().requires_grad_()
            logits = self.language(batch["input_ids"], leaf, attention_mask=batch["attention_mask"],
                                   position_ids=batch["position_ids"])
            local = token_loss_sum(logits, batch["labels"])
            self.language.backward(local / n_labels * (dp * gas))
            # the rows' gradient is already scaled like the language loss: no second 1/gas
            self.vision.backward((rows * leaf.grad).sum(), scale_wrt_gas=False)
            self.language.step()
            self.vision.step()
            loss_sum += float(local.detach())
        loss = torch.tensor([loss_sum], dtype=torch.float64)
        self.dist.all_reduce(loss)
        return dict(loss=float(loss) / n_labels, num_tokens=n_labels, step_time=time.perf_counter() - start,
                    stage_time={}, boundary_bytes=0)
