#!/bin/sh
# CAPO on verl 0.9.1 with the settings of the CAPO paper's 1.5B run (arXiv 2604.12632): Qwen2.5-Math-1.5B,
# 20k DeepScaleR problems, 128 prompts x 8 rollouts, mini-batch 64, lr 1e-6, clip 0.2, temperature 1.0, 600 steps,
# KL and entropy coefficients 0.
#
# Needs GPUs (8 x 80 GB assumed below; set NGPUS) and verl's inference engine (vLLM), which the CPU environment of
# scripts/engine-env.sh verl does not install. capo must be installed in the same environment as verl
# (pip install -e '.[verl]' in capo's clone, or pip install -e . --no-deps): verl then loads capo's plugin by itself
# (entry point group verl.plugins) and algorithm.adv_estimator=capo becomes available.
#
#   python examples/verl/prepare_deepscaler.py --out "$DATA"      # once
#   DATA=~/data/capo NGPUS=8 sh examples/verl/run_capo_qwen2.5_math_1.5b.sh [extra hydra overrides]
#
# Settings the paper does not state are marked "(not stated)": they are verl's defaults or a common choice, and
# are listed in docs/engines.md.
set -eu
DATA=${DATA:-$HOME/data/capo}
NGPUS=${NGPUS:-8}
HERE=$(cd "$(dirname "$0")" && pwd)

# Each line below is one setting; the comment says where it comes from.
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=capo `# capo's CAPO estimator, registered by the capo plugin` \
    +algorithm.capo.advantage_kwargs.tau=0.6 `# logistic-surrogate temperature, paper: 0.6 for 1.5B (0.5 for 7B)` \
    +algorithm.capo.noise_mask=fixed `# reference-perplexity noise mask at fixed thresholds (paper Sec. 4.3)` \
    +algorithm.capo.mask_low=1.05 `# keep an incorrect response only if PPL_ref >= 1.05 (paper, Qwen2.5-Math)` \
    +algorithm.capo.mask_high=2.5 `# keep a correct response only if PPL_ref <= 2.5 (paper, Qwen2.5-Math)` \
    algorithm.use_kl_in_reward=False `# no KL in the reward (paper: KL coefficient 0)` \
    data.train_files="$DATA/train.parquet" `# 20k DeepScaleR problems (prepare_deepscaler.py)` \
    data.val_files="$DATA/test.parquet" `# MATH-500 for periodic validation (not stated)` \
    data.train_batch_size=128 `# 128 prompts per step (paper)` \
    data.max_prompt_length=1024 `# (not stated) fits DeepScaleR prompts` \
    data.max_response_length=3072 `# (not stated) prompt + response = Qwen2.5-Math's 4096-token context` \
    data.filter_overlong_prompts=True `# drop prompts longer than max_prompt_length instead of failing` \
    data.truncation=error `# never silently cut a prompt` \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B `# base model (paper)` \
    actor_rollout_ref.model.use_remove_padding=True `# packing for speed; no effect on the math` \
    actor_rollout_ref.actor.optim.lr=1e-6 `# learning rate (paper)` \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 `# mini-batch of 64 prompts (x 8 rollouts) -> 2 updates/step (paper)` \
    actor_rollout_ref.actor.ppo_epochs=1 `# one pass over each batch (not stated; verl default)` \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 `# memory only: gradient accumulation inside a mini-batch` \
    actor_rollout_ref.actor.clip_ratio=0.2 `# PPO clip epsilon (paper)` \
    actor_rollout_ref.actor.loss_agg_mode=token-mean `# (not stated) verl default aggregation` \
    actor_rollout_ref.actor.entropy_coeff=0 `# entropy bonus 0 (paper)` \
    actor_rollout_ref.actor.use_kl_loss=True `# turns the reference policy on, so verl computes ref_log_prob for the mask` \
    actor_rollout_ref.actor.kl_loss_coef=0 `# ... with weight 0: the KL term does not change the loss (paper: KL 0)` \
    actor_rollout_ref.actor.fsdp_config.param_offload=False `# memory knob` \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False `# memory knob` \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 `# memory only: reference forward chunking` \
    actor_rollout_ref.ref.fsdp_config.param_offload=True `# keep the frozen reference off the GPU between uses` \
    actor_rollout_ref.rollout.name=vllm `# inference engine for sampling` \
    actor_rollout_ref.rollout.n=8 `# 8 rollouts per prompt (paper)` \
    actor_rollout_ref.rollout.temperature=1.0 `# sampling temperature (paper)` \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 `# a 1.5B model fits one GPU` \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 `# memory knob for vLLM's KV cache` \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 `# memory only: old-log-prob recomputation` \
    reward.custom_reward_function.path="$HERE/capo_reward.py" `# capo's rewards, math-verify equivalence` \
    reward.custom_reward_function.name=compute_score_correctness `# binary correctness: CAPO's P/N sets` \
    trainer.total_training_steps=600 `# 600 steps (paper, 1.5B; 400 for 7B)` \
    trainer.n_gpus_per_node="$NGPUS" `# hardware` \
    trainer.nnodes=1 `# hardware` \
    trainer.critic_warmup=0 `# no critic (group-relative advantages)` \
    trainer.save_freq=100 `# checkpoint every 100 steps (not stated)` \
    trainer.test_freq=50 `# validate every 50 steps (not stated)` \
    trainer.logger='["console","tensorboard"]' `# where metrics go` \
    trainer.project_name=capo \
    trainer.experiment_name=capo-qwen2.5-math-1.5b-deepscaler \
    "$@"
