"""Every `Config` field as an absl flag, and the command-line error handling.

Usage in an entry point:

    from absl import app
    from impala_tf import flags as impala_flags

    impala_flags.define_flags()

    def main(argv):
      cfg = impala_flags.exit_on_config_error(
          'impala_tf.train', impala_flags.config_from_flags)
      ...

    if __name__ == '__main__':
      app.run(main, flags_parser=impala_flags.parse_flags)

Each flag has the name and the default of the `Config` field it sets (the defaults
are read from `Config`, never repeated here). Spelling on the command line:

* booleans: `--use_lstm`, `--nouse_lstm`, `--use_lstm=false`;
* optional numbers (`target_return`, `clip_rho_threshold`, `clip_pg_rho_threshold`):
  a number, or `none` (any case, or empty) for None;
* `mlp_hidden_sizes`: comma-separated integers, `--mlp_hidden_sizes=256,256`;
* integers also accept `1_000_000` and integral exponent forms such as `2e8`;
* `--flagfile=configs/cartpole.cfg` reads flags from a file; later flags override it.

A value that cannot be parsed ends the program with status 2 and one line on stderr,
`<prog>: error: <message naming the flag>`; so does a value that `Config` rejects
(`exit_on_config_error`). `python -m impala_tf.flags` prints docs/flags.md.
`parse_flags` first checks the installed TensorFlow (`tensorflow_version_error`):
one older than `MIN_TENSORFLOW` ends the program the same way, saying what it needs.
"""

import collections
import dataclasses
import importlib.metadata
import math
import os
import re
import sys
from typing import Callable, List, Optional, Sequence

from absl import flags as absl_flags

from impala_tf import config as config_lib

FLAGS = absl_flags.FLAGS

# The error exit status, as argparse uses for usage errors.
EXIT_USAGE = 2

_NONE_SPELLINGS = ('none', '')

# One flag: the Config field it sets, its kind and its help text. The help gives the
# meaning (with the RLlib / scalable_agent name where ours differs), the unit and the
# valid range; absl appends the default and the type.
_Flag = collections.namedtuple('_Flag', ['name', 'kind', 'help'])

# Kinds: 'string', 'int', 'float', 'bool', 'enum', 'optional_float', 'int_list',
# 'network' (a string: one of NETWORKS or MODULE:FUNCTION, checked by Config).
_ENUM_VALUES = {
    'env_vectorization': config_lib.ENV_VECTORIZATIONS,
    'env_backend': config_lib.ENV_BACKENDS,
    'actor_backend': config_lib.ACTOR_BACKENDS,
    'learner_backend': config_lib.LEARNER_BACKENDS,
    'learner_jit': config_lib.LEARNER_JIT,
    'reward_clipping': config_lib.REWARD_CLIPPINGS,
    'loss_reduction': config_lib.LOSS_REDUCTIONS,
    'optimizer': config_lib.OPTIMIZERS,
    'rmsprop_style': config_lib.RMSPROP_STYLES,
    'network': config_lib.NETWORKS + ('MODULE:FUNCTION',),
}

_SCHEDULE_HELP = (
    "'constant'; 'linear' (decay to 0 at --total_environment_frames); or "
    "piecewise-linear points 'FRAMES:VALUE,FRAMES:VALUE,...' over env frames with "
    'increasing FRAMES, VALUE being the value at that frame, held constant outside '
    'the points; FRAMES written P% are that share of --total_environment_frames '
    '(all points or none) and VALUE written Vx is V times the base value, so '
    "'0%:1x,30%:0.15x,100%:0x' follows --learning_rate and the run's length; the "
    'position is the fresh env frames trained on')

# (key, title, flags). The order is the order of --helpfull and docs/flags.md.
SECTIONS = (
    ('environment', 'Environment', (
        _Flag('env', 'string',
              'Gymnasium environment id, e.g. CartPole-v1 (classic control, vector '
              'observations) or ALE/Pong-v5 (Atari with DeepMind preprocessing; '
              'needs the atari extra, ale-py).'),
        _Flag('env_vectorization', 'enum',
              "How an actor steps its num_envs_per_actor envs: 'sync' (gymnasium "
              "SyncVectorEnv, in the actor's thread), 'async' (AsyncVectorEnv, one "
              "subprocess per env), 'auto' (the env's own batched implementation "
              "where gymnasium registers one, e.g. CartPole; else 'sync'). Only "
              "'auto' with EnvPool, which vectorizes in C++."),
        _Flag('env_backend', 'enum',
              "Atari emulator backend: 'gymnasium' (ale-py with gymnasium's "
              "wrappers, stepped as --env_vectorization says), 'envpool' (EnvPool's "
              "C++ thread pool; needs pip install envpool, in the atari extra), "
              "'auto' (EnvPool for the Atari games it has when it is installed and "
              "--noop_max >= 1, else gymnasium; one line on stderr says so when "
              "envpool is installed but does not import). Both give the same "
              'preprocessing, episode ends, returns and observation layout. '
              'Non-Atari envs always use gymnasium. The backend a run used is '
              'written to its config.json and its first log line.'),
        _Flag('envpool_num_threads', 'int',
              "With EnvPool: C++ threads of each actor's env pool; 0 is EnvPool's "
              "default, one per env up to the machine's cores (per actor: with many "
              'actors on many cores, set it to about cores / num_actors). '
              'Range: >= 0.'),
        _Flag('noop_max', 'int',
              'Atari: up to this many no-op frames (a random number) after each '
              'reset (DeepMind preprocessing). 0 disables. Range: >= 0.'),
        _Flag('episodic_life', 'bool',
              'Atari: a lost life ends the episode for the learner (terminated), as '
              'in the paper; the game goes on, and reported episode returns remain '
              'whole-game scores.'),
        _Flag('frame_stack', 'int',
              'Atari: number of most recent 84x84 grayscale frames stacked into one '
              'observation (1 with --use_lstm: the LSTM replaces the stack). '
              'Range: >= 1.'),
        _Flag('max_episode_frames', 'int',
              'Time limit of an episode in env frames: Atari emulator frames '
              '(108000 = 30 minutes of play), agent steps for other envs (which '
              'also keep their registered limit). Reaching it truncates the '
              'episode: bootstrapped, not terminal. Range: >= 1.'),
        _Flag('env_step_timeout_secs', 'float',
              "--env_vectorization=async: seconds an actor waits for one step of "
              'its envs; an env that takes longer is treated as hung: the actor is '
              'restarted with fresh env processes (like an env that raises). '
              'Refused with EnvPool (no env processes). Range: > 0.'),
    )),
    ('actors', 'Actors', (
        _Flag('num_actors', 'int',
              'Actors, each stepping one vector env with a policy snapshot (a '
              'thread or a Ray actor process, see --actor_backend; RLlib: '
              'num_workers / num_env_runners). Range: >= 1.'),
        _Flag('num_envs_per_actor', 'int',
              'Environments in each actor\'s vector env (RLlib: '
              'num_envs_per_worker). Range: >= 1.'),
        _Flag('unroll_length', 'int',
              'T: agent steps per unroll; an unroll holds T+1 steps, overlapping the '
              'next by one (RLlib: rollout_fragment_length, formerly '
              'sample_batch_size; scalable_agent: unroll_length). Range: >= 1.'),
        _Flag('broadcast_interval', 'int',
              'Learner updates between refreshes of the actors\' policy snapshots '
              '(RLlib: broadcast_interval). Range: >= 1.'),
        _Flag('actor_backend', 'enum',
              "Where actors run: 'threads' (threads of the learner's process; "
              "cheapest start), 'processes' (one local child process each, unrolls "
              'and weights through shared memory: acting takes no share of the '
              "learner's interpreter lock) or 'ray' (one Ray actor process each, on "
              'this machine or a Ray cluster; needs the ray extra). All produce the '
              'same unrolls; see docs/scaling.md.'),
        _Flag('ray_address', 'string',
              "With --actor_backend=ray: '' starts a local Ray instance sized to "
              'this machine, listening on 127.0.0.1 only, without dashboard, shut '
              "down at exit; 'auto' or an address (HOST:PORT of `ray start "
              "--head`) joins that cluster and leaves it running."),
        _Flag('ray_connect_timeout_secs', 'float',
              'With --actor_backend=ray and a --ray_address: seconds the cluster '
              'has to answer and accept this driver before the run stops with one '
              'line naming the address. Range: > 0.'),
        _Flag('ray_actor_resources', 'string',
              'With --actor_backend=ray: the Ray resources each actor reserves, a '
              'JSON object such as {"CPU": 1} or {"CPU": 1, "actor_node": 1} (a '
              'custom resource of `ray start --resources` places actors on those '
              'nodes); {} reserves nothing. Range: numbers >= 0.'),
        _Flag('max_actor_restarts', 'int',
              'With --actor_backend=ray or processes: actor processes replaced over '
              'the whole run (all actors together; each replacement waits 1, 2, 4, '
              '... up to 30 s after its actor died again without an unroll); one '
              'more death stops the run with one line naming its cause. Range: >= 0.'),
        _Flag('actor_unroll_timeout_secs', 'float',
              'With --actor_backend=ray: an actor that answers no unroll within '
              'this many seconds of starting on it (a hung env step) is killed and '
              'replaced, counting as a restart. Range: > 0.'),
        _Flag('ray_placement_timeout_secs', 'float',
              'With --actor_backend=ray: seconds the run waits, at its start, for '
              'the Ray cluster to have the resources of all --num_actors actors '
              'available at once (a busy cluster freeing them, an autoscaling one '
              'adding nodes), saying what it waits for; then it stops with one '
              'line. Range: > 0.'),
        _Flag('ray_runtime_env', 'string',
              "With --actor_backend=ray: '' (the actors' nodes have the code and "
              "packages already) or Ray's runtime_env for every actor as a JSON "
              'object with keys working_dir, py_modules, pip, env_vars, excludes, '
              'e.g. {"working_dir": "."} ships this checkout (impala_tf and your '
              'env modules) to nodes that do not have it; {"pip": [...]} installs '
              'packages there.'),
    )),
    ('data', 'Data pipeline', (
        _Flag('batch_size', 'int',
              'Unrolls per learner update, split evenly across the learner replicas '
              '(RLlib: train_batch_size, which counts steps: batch_size x '
              'unroll_length). Range: >= 1, a multiple of the number of replicas.'),
        _Flag('num_data_loader_buffers', 'int',
              'Parallel tf.data loaders (interleave cycle length) filling batches '
              'while the learner trains (RLlib: num_data_loader_buffers). '
              'Range: >= 1.'),
        _Flag('minibatch_buffer_size', 'int',
              'Ring of recent batches that reuse (num_sgd_iter > 1) interleaves over '
              '(RLlib: minibatch_buffer_size). Range: >= 1.'),
        _Flag('num_sgd_iter', 'int',
              'Times each batch is used for an SGD update (RLlib: num_sgd_iter). '
              'With minibatch_buffer_size 1 the learner makes the k updates on a '
              'batch in one call, fetching it once (so a call makes a multiple of '
              'k steps); with a larger ring, tf.data replays the ring. '
              'Range: >= 1.'),
        _Flag('replay_proportion', 'float',
              'Replayed unrolls mixed in per fresh unroll: floor(p), plus one more '
              'with probability frac(p) (RLlib: replay_proportion). 0 disables '
              'replay. Range: >= 0.'),
        _Flag('replay_buffer_num_slots', 'int',
              'Replay FIFO capacity in unrolls: replays are drawn uniformly from the '
              'last this many fresh unrolls (RLlib: replay_buffer_num_slots). '
              'Range: >= 0; >= max(1, ceil(replay_proportion)) when '
              'replay_proportion > 0.'),
        _Flag('learner_queue_size', 'int',
              'Capacity of the bounded queue from the actors to the learner\'s data '
              'pipeline, in actor chunks of num_envs_per_actor unrolls; a full '
              'queue blocks the actors (RLlib: learner_queue_size, in batches). '
              'Range: >= 1.'),
        _Flag('learner_queue_timeout', 'float',
              'Seconds the learner waits for data before stopping the run with an '
              'error (RLlib: learner_queue_timeout). Range: > 0.'),
    )),
    ('learner', 'Learner and devices', (
        _Flag('learner_steps_per_call', 'int',
              'Learner steps per call into TensorFlow: k steps run in one '
              'tf.while_loop over the data iterator, so the Python-to-TensorFlow '
              'call, the weights published to the actors and the metrics read are '
              'paid once per k steps (Keras: steps_per_execution). The update is the '
              'same; the actors\' policy lags up to k - 1 steps more. Range: >= 1.'),
        _Flag('learner_jit', 'enum',
              "XLA for the learner's per-replica gradient (forward and backward "
              "pass, V-trace, losses): 'on', 'off', or 'auto' (what measured "
              "faster on the device type: off on the CPU, where XLA's convolutions "
              "are slower; GPUs not measured yet, so off). 'on' with several "
              'replicas needs no whole-batch sum before the gradient: not with '
              "--popart, --loss_reduction=mean or --normalize_advantages."),
        _Flag('num_gpus', 'int',
              'Learner GPUs, one MirroredStrategy replica each; each batch is split '
              'evenly across them. 0: learn on the CPU (RLlib: num_gpus). '
              'Range: >= 0.'),
        _Flag('num_virtual_cpu_devices', 'int',
              'Split the CPU into this many logical devices, one learner replica '
              'each (multi-tower learning without GPUs, for testing). 0: the CPU is '
              'one device. Range: >= 0; 0 when --num_gpus is set.'),
        _Flag('tf_inter_op_threads', 'int',
              "Threads of TensorFlow's inter-op pool in the trainer process (RLlib: "
              'tf_session_args.inter_op_parallelism_threads). -1: auto, 1 where the '
              'learner is one CPU replica and thread actors act with numpy (a '
              'feed-forward MLP): there one thread measured 1.0-1.5x the env frames/s '
              'of the CartPole defaults and 1.2x the learner frames/s with '
              "--num_sgd_iter=4 on 2 cores (docs/benchmarks.md); else TensorFlow's "
              "default. 0: TensorFlow's default (one per core). Range: >= -1."),
        _Flag('num_learner_workers', 'int',
              'Learner worker processes (tf.distribute.MultiWorkerMirroredStrategy '
              'over all their replicas; each worker has its own --num_actors '
              'actors). > 1 without TF_CONFIG: starts that many workers on this host, '
              'TF_CONFIG on 127.0.0.1 ports (TensorFlow listens on them on all '
              'interfaces: docs/scaling.md). A process started with a TF_CONFIG '
              'naming several workers is that worker (this flag then must be 1 or '
              "their number). --batch_size is the global batch. Range: >= 1."),
        _Flag('learner_worker_timeout_secs', 'float',
              'With --num_learner_workers > 1 (started on this host): seconds '
              'after one worker dies, or after a forwarded Ctrl-C / SIGTERM, before '
              'workers still running are killed; the death is one line naming the '
              'worker. Range: > 0.'),
        _Flag('stall_timeout_secs', 'float',
              'Progress watchdog: a learner that makes no step, and gets no '
              'data, for this many seconds (at least twice '
              '--learner_queue_timeout, so data that stops is reported as such '
              'first; the first step\'s tracing included) stops the run with one '
              'line saying where it is stuck; with several learner workers the '
              'line names the worker the run waits for, from heartbeats in '
              '--logdir/heartbeats. 0: off. Range: >= 0.'),
        _Flag('learner_backend', 'enum',
              "Where --num_learner_workers > 1 (without TF_CONFIG) starts the "
              "workers: 'local' (processes on this host, TF_CONFIG on 127.0.0.1) or "
              "'ray' (Ray actors at --ray_address, '' for a local Ray, each with "
              '--ray_learner_resources, TF_CONFIG wired from the nodes they landed '
              "on; needs pip install -e '.[ray]')."),
        _Flag('ray_learner_resources', 'string',
              'With --learner_backend=ray: the Ray resources each learner worker '
              'reserves, a JSON object such as {"CPU": 1} or {"GPU": 1} (give '
              '--num_gpus to match). Range: numbers >= 0.'),
    )),
    ('loss', 'Loss', (
        _Flag('discounting', 'float',
              'Discount per agent step, gamma (RLlib: gamma; scalable_agent: '
              'discounting). Range: [0, 1].'),
        _Flag('baseline_cost', 'float',
              'Weight of the baseline loss 0.5 * sum (v_s - V(x_s))^2 (RLlib: '
              'vf_loss_coeff; scalable_agent applies another 0.5). Range: >= 0.'),
        _Flag('entropy_cost', 'float',
              'Weight of the entropy bonus (RLlib: entropy_coeff). Range: >= 0.'),
        _Flag('entropy_cost_schedule', 'string',
              'Schedule of entropy_cost (RLlib: entropy_coeff_schedule): '
              + _SCHEDULE_HELP + '.'),
        _Flag('vtrace', 'bool',
              'Correct for the actors\' stale policies with V-trace; --novtrace uses '
              'no importance weighting (RLlib: vtrace).'),
        _Flag('clip_rho_threshold', 'optional_float',
              'rho-bar: clip of the importance weights in the V-trace value targets '
              '(RLlib: vtrace_clip_rho_threshold). A number > 0, or none for no '
              'clipping.'),
        _Flag('clip_pg_rho_threshold', 'optional_float',
              'rho-bar-pg: clip of the importance weights in the policy-gradient '
              'advantages (RLlib: vtrace_clip_pg_rho_threshold). A number > 0, or '
              'none for no clipping.'),
        _Flag('vtrace_lambda', 'float',
              'lambda in the V-trace traces c_t = lambda * min(1, rho_t) (SEED RL); '
              '1 is the paper\'s V-trace. Range: [0, 1].'),
        _Flag('reward_clipping', 'enum',
              "Rewards as the learner sees them: 'abs_one' clips to [-1, 1] (the "
              "paper's Atari setting), 'soft_asymmetric' squashes with tanh and "
              "scales negatives by 0.3 (scalable_agent, DMLab), 'none' leaves them. "
              'Reported returns are never clipped.'),
        _Flag('reward_scale', 'float',
              'Multiply rewards by this before --reward_clipping, as the learner '
              'sees them (e.g. 0.01 brings CartPole\'s value targets near 1). '
              'Reported returns are never scaled. Range: > 0.'),
        _Flag('loss_reduction', 'enum',
              "'sum': every loss term is a sum over the T x B valid steps of the "
              "batch (the paper, scalable_agent); 'mean': divided by the number of "
              'valid steps in the whole batch (RLlib). The same update on any '
              'number of replicas either way; docs/flags.md says how learning '
              'rate, grad_clip and adam_epsilon translate between them.'),
        _Flag('popart', 'bool',
              'PopArt value normalisation (van Hasselt et al. 2016; Hessel et al. '
              '2019): the value head predicts (V - mu) / sigma from running moments '
              'of the V-trace targets, rescaled so its outputs in return units are '
              'preserved when mu and sigma move; the baseline loss and the policy-'
              'gradient advantages are divided by sigma, so the step no longer '
              'depends on the reward scale.'),
        _Flag('popart_beta', 'float',
              'Step size of PopArt\'s running first and second moments of the '
              'V-trace targets (debiased like Adam\'s, so the first batch sets '
              'them). Hessel et al. use 3e-4 on Atari. Range: (0, 1].'),
        _Flag('popart_sigma_floor', 'float',
              'PopArt\'s sigma is kept at least this fraction of the largest '
              'spread of the targets so far: when the targets come to be all alike '
              '(every episode at a time limit) their spread would shrink towards 0 '
              'and blow the normalised value errors up by 1/sigma until the value '
              'term swamps the step. Relative to that peak, the floor moves with '
              'neither the scale nor the shift of the returns. 0: only the fixed '
              'bound 1e-4. Range: [0, 1].'),
        _Flag('ppo_clip', 'float',
              'Clip range epsilon of a clipped-surrogate policy loss (APPO, as in '
              'RLlib and Sample Factory): -min(r A, clip(r, 1 - eps, 1 + eps) A), '
              'r the ratio of the learner\'s policy to the behaviour policy of the '
              'action, A V-trace\'s policy-gradient advantage; value targets stay '
              'V-trace\'s. It bounds how far a batch used --num_sgd_iter times can '
              'move the policy. 0: IMPALA\'s -log pi(a) A. Range: [0, 1).'),
        _Flag('normalize_advantages', 'bool',
              'Normalise the policy-gradient advantages to zero mean and unit '
              'variance over the valid steps of each batch (the whole batch, on '
              'every replica), as PPO implementations do; the advantages of a '
              'batch then never all push the same way.'),
        _Flag('loss_term_grad_norms', 'bool',
              'Log the gradient norm of each weighted loss term (policy, baseline, '
              'entropy) on the same batch (grad_norm_policy, grad_norm_baseline, '
              'grad_norm_entropy): three backward passes instead of one, paid only '
              'on the learner call just before each metrics line (and the first; on '
              'every call with several learner workers).'),
    )),
    ('optimizer', 'Optimizer', (
        _Flag('optimizer', 'enum',
              "'rmsprop' with the original IMPALA (TF1) semantics: epsilon inside "
              "the square root, accumulator starting at 1; or 'adam' (RLlib: "
              'opt_type).'),
        _Flag('learning_rate', 'float',
              'Initial learning rate (RLlib: lr). Range: > 0.'),
        _Flag('lr_schedule', 'string',
              'Schedule of the learning rate (RLlib: lr_schedule): '
              + _SCHEDULE_HELP + ". The paper uses 'linear'."),
        _Flag('rmsprop_decay', 'float',
              'RMSProp decay of the mean square (RLlib: decay). Range: [0, 1).'),
        _Flag('rmsprop_momentum', 'float',
              'RMSProp momentum (RLlib: momentum). Range: [0, 1).'),
        _Flag('rmsprop_epsilon', 'float',
              'RMSProp epsilon: added inside the square root with '
              '--rmsprop_style=tf1 (RLlib: epsilon; scalable_agent: 0.1), to the '
              'root with torch. Range: > 0.'),
        _Flag('rmsprop_style', 'enum',
              "RMSProp's form. tf1 (the paper's, scalable_agent's, TF1's "
              'RMSPropOptimizer): w -= lr g / sqrt(ms + epsilon), ms starting at 1. '
              "torch (PyTorch's torch.optim.RMSprop, TorchBeast's): w -= lr g / "
              '(sqrt(ms) + epsilon), ms starting at 0. With epsilon 0.01 and small '
              'gradients a torch step is up to 10x a tf1 step at the same '
              'learning rate; see "RMSProp: tf1 or torch" below.'),
        _Flag('adam_beta1', 'float', 'Adam beta1. Range: [0, 1).'),
        _Flag('adam_beta2', 'float', 'Adam beta2. Range: [0, 1).'),
        _Flag('adam_epsilon', 'float', 'Adam epsilon. Range: > 0.'),
        _Flag('grad_clip', 'float',
              'Clip of the global gradient norm, applied once after the '
              'cross-replica all-reduce (RLlib: grad_clip). 0 disables clipping. '
              'Range: >= 0.'),
        _Flag('max_nonfinite_updates', 'int',
              'An update whose loss or gradient is NaN or Inf is skipped (weights '
              'and optimizer slots unchanged; counted as nonfinite_updates in the '
              'metrics); this many in a row stop the run with an error, keeping '
              'the last checkpoint. Range: >= 1.'),
    )),
    ('network', 'Network', (
        _Flag('network', 'network',
              "Torso: 'mlp' for vector observations, 'shallow' or 'deep' (ResNet) "
              "for images (paper, Fig. 3); 'auto' picks mlp for vector observations "
              "and deep for images; or MODULE:FUNCTION, your own torso: "
              'FUNCTION(observation_space, action_space) returns a Keras model or '
              'layer, a tf.Module or a callable mapping float32 [B, *obs_shape] to '
              '[B, F]; impala_tf adds the heads and the LSTM core (docs/library.md).'),
        _Flag('mlp_hidden_sizes', 'int_list',
              'Widths of the hidden layers of the mlp torso, comma-separated. '
              'Range: one or more integers >= 1.'),
        _Flag('use_lstm', 'bool',
              'Add an LSTM core after the torso, fed the torso output, the one-hot '
              'previous action and the clipped previous reward; its state resets '
              'where an episode starts.'),
        _Flag('lstm_size', 'int', 'Units of the LSTM core. Range: >= 1.'),
        _Flag('shared_torso', 'bool',
              'Whether the policy and value heads share one torso. Unset (the '
              'default): a separate value MLP of --mlp_hidden_sizes for an mlp '
              'torso without LSTM (the layout of SB3\'s PPO; it keeps the value '
              'term, large while the value learns the return scale, from '
              'collapsing the policy through the shared features: docs/design.md), '
              'one shared torso otherwise (the paper). --shared_torso shares it '
              'always; --noshared_torso needs the mlp torso without LSTM.'),
    )),
    ('run', 'Run', (
        _Flag('total_environment_frames', 'int',
              'Stop after this many env frames (agent steps x action repeat; 4 for '
              'Atari, 1 otherwise); also the horizon of linear schedules '
              '(scalable_agent: total_environment_frames; RLlib: stop '
              'timesteps_total). Range: >= batch_size x unroll_length.'),
        _Flag('target_return', 'optional_float',
              'Stop early once the mean episode return over the last 100 episodes '
              'reaches this. none: train for total_environment_frames.'),
        _Flag('seed', 'int',
              'Seed of the network initialisation, actors and environments. '
              'Range: [0, 2^31).'),
        _Flag('logdir', 'string',
              'Directory of the run: config.json, checkpoints/, TensorBoard events, '
              'metrics.jsonl, saved_policy/. A run started on a logdir with '
              'checkpoints resumes from the latest.'),
        _Flag('checkpoint_interval_secs', 'float',
              'Seconds between checkpoints (one is also written at the end). '
              'Range: > 0.'),
        _Flag('keep_checkpoints', 'int',
              'Most recent checkpoints kept in logdir. Range: >= 1.'),
        _Flag('log_interval_secs', 'float',
              'Seconds between metrics lines (console, metrics.jsonl, TensorBoard). '
              'Range: > 0.'),
        _Flag('eval_interval_frames', 'int',
              'Evaluate the policy every this many env frames while training '
              '(RLlib: evaluation_interval; SB3: EvalCallback\'s eval_freq): '
              '--eval_episodes whole episodes on envs of their own with the latest '
              'weights, in a thread the learner never waits for; logged as '
              'eval_return_mean (and eval_episodes, eval_env_frames) in '
              'metrics.jsonl and eval/ in TensorBoard. 0: no evaluation. '
              'Range: >= 0.'),
        _Flag('eval_episodes', 'int',
              'Episodes of each periodic evaluation. Range: >= 1.'),
        _Flag('eval_greedy', 'bool',
              'Periodic evaluations act greedily (argmax of the policy); '
              '--noeval_greedy samples from it, as the actors do.'),
    )),
)

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(config_lib.Config)}


class _IntParser(absl_flags.IntegerParser):
  """An integer; also accepts `1_000_000` and integral exponent forms like `2e8`."""

  def __init__(self):
    super().__init__()

  def convert(self, argument):
    if isinstance(argument, int) and not isinstance(argument, bool):
      return argument
    if not isinstance(argument, str):
      raise TypeError(f'expected an integer, got {argument!r}')
    text = argument.strip()
    try:
      return int(text, 10)
    except ValueError:
      pass
    try:
      number = float(text)
    except ValueError:
      number = math.nan
    if math.isfinite(number) and number.is_integer():
      return int(number)
    raise ValueError(f'expected an integer, got {argument!r}')


class _FloatParser(absl_flags.FloatParser):
  """A float, with a short error message."""

  def __init__(self):
    super().__init__()

  def convert(self, argument):
    try:
      return super().convert(argument)
    except ValueError:
      raise ValueError(f'expected a number, got {argument!r}') from None


class _OptionalFloatParser(absl_flags.ArgumentParser):
  """A float, or None spelt `none` (any case) or the empty string."""

  syntactic_help = "a number, or 'none'"

  def parse(self, argument):
    if argument is None:
      return None
    if isinstance(argument, str):
      text = argument.strip()
      if text.lower() in _NONE_SPELLINGS:
        return None
      try:
        return float(text)
      except ValueError:
        raise ValueError(
            f"expected a number or 'none', got {argument!r}") from None
    if isinstance(argument, (int, float)) and not isinstance(argument, bool):
      return float(argument)
    raise TypeError(f"expected a number or 'none', got {argument!r}")

  def flag_type(self):
    return 'float or none'


class _OptionalFloatSerializer(absl_flags.ArgumentSerializer):

  def serialize(self, value):
    return 'none' if value is None else repr(float(value))


class _IntListParser(absl_flags.ArgumentParser):
  """Comma-separated integers, e.g. `64,64`, into a list of ints."""

  syntactic_help = 'a comma-separated list of integers'

  def parse(self, argument):
    if isinstance(argument, (list, tuple)):
      items = list(argument)
    elif isinstance(argument, str):
      text = argument.strip()
      items = [s.strip() for s in text.split(',')] if text else []
    else:
      raise TypeError(f'expected comma-separated integers, got {argument!r}')
    values = []
    for item in items:
      if isinstance(item, int) and not isinstance(item, bool):
        values.append(item)
        continue
      try:
        values.append(int(item, 10))
      except (TypeError, ValueError):
        raise ValueError(
            f'expected comma-separated integers, got {argument!r}') from None
    return values

  def flag_type(self):
    return 'int list'


class _IntListSerializer(absl_flags.ArgumentSerializer):

  def serialize(self, value):
    return ','.join(str(v) for v in value)


def _iter_flags():
  for _, _, section_flags in SECTIONS:
    yield from section_flags


def define_flags(flag_values: absl_flags.FlagValues = FLAGS) -> None:
  """Defines one flag per `Config` field in `flag_values`.

  Safe to call more than once: flags already defined in `flag_values` are kept.

  Args:
    flag_values: where to define the flags; absl's global FLAGS by default.
  """
  for key, _, section_flags in SECTIONS:
    for spec in section_flags:
      if spec.name in flag_values:
        continue
      default = _DEFAULTS[spec.name]
      help_text = f'[{key}] {spec.help}'
      kwargs = dict(flag_values=flag_values)
      if spec.kind in ('string', 'network'):
        absl_flags.DEFINE_string(spec.name, default, help_text, **kwargs)
      elif spec.kind == 'bool':
        absl_flags.DEFINE_bool(spec.name, default, help_text, **kwargs)
      elif spec.kind == 'enum':
        absl_flags.DEFINE_enum(spec.name, default, list(_ENUM_VALUES[spec.name]),
                               help_text, **kwargs)
      elif spec.kind == 'int':
        absl_flags.DEFINE(_IntParser(), spec.name, default, help_text,
                          serializer=absl_flags.ArgumentSerializer(), **kwargs)
      elif spec.kind == 'float':
        absl_flags.DEFINE(_FloatParser(), spec.name, default, help_text,
                          serializer=absl_flags.ArgumentSerializer(), **kwargs)
      elif spec.kind == 'optional_float':
        absl_flags.DEFINE(_OptionalFloatParser(), spec.name, default, help_text,
                          serializer=_OptionalFloatSerializer(), **kwargs)
      elif spec.kind == 'int_list':
        absl_flags.DEFINE(_IntListParser(), spec.name, default, help_text,
                          serializer=_IntListSerializer(), **kwargs)
      else:
        raise AssertionError(f'unknown flag kind {spec.kind!r} of {spec.name}')


def config_from_flags(
    flag_values: absl_flags.FlagValues = FLAGS) -> config_lib.Config:
  """Builds the validated Config from the flags' values.

  Args:
    flag_values: FlagValues on which `define_flags` was called (parsed or not; an
      unparsed one gives the defaults).

  Returns:
    The Config.

  Raises:
    ConfigError: from Config validation, naming the field (= the flag).
  """
  values = {}
  for spec in _iter_flags():
    value = flag_values[spec.name].value
    if spec.kind == 'int_list':
      value = tuple(value)
    values[spec.name] = value
  return config_lib.Config(**values)


def prog_name(argv: Optional[Sequence[str]] = None) -> str:
  """The program name for error lines: `impala_tf.train` under `python -m`.

  Args:
    argv: the command line; sys.argv by default.

  Returns:
    The module name when the program runs with `python -m`, else the base name of
    argv[0].
  """
  argv = sys.argv if argv is None else argv
  main = sys.modules.get('__main__')
  spec = getattr(main, '__spec__', None)
  main_file = getattr(main, '__file__', None)
  if (spec is not None and spec.name and argv and main_file and
      os.path.abspath(argv[0]) == os.path.abspath(main_file)):
    name = spec.name
    return name[:-len('.__main__')] if name.endswith('.__main__') else name
  if argv and argv[0]:
    return os.path.basename(argv[0])
  return 'impala_tf'


# The oldest TensorFlow impala_tf runs on: setup.py's lower bound, tested by CI.
MIN_TENSORFLOW = (2, 12)
_TENSORFLOW_DISTRIBUTIONS = ('tensorflow', 'tensorflow-cpu', 'tensorflow-gpu',
                             'tensorflow-macos', 'tf-nightly')


def _installed_tensorflow_version() -> Optional[str]:
  """The loaded TensorFlow's version, else the installed distribution's, else None."""
  if 'tensorflow' in sys.modules:
    return getattr(sys.modules['tensorflow'], '__version__', None)
  for dist in _TENSORFLOW_DISTRIBUTIONS:
    try:
      return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
      pass
  return None


def tensorflow_version_error(version: Optional[str] = None) -> Optional[str]:
  """Says what TensorFlow impala_tf needs if `version` is older; else None.

  Args:
    version: a TensorFlow version string; by default the installed one, read from
      the loaded module or the package metadata (importing TensorFlow takes
      seconds). None when neither is found: the import will say so.
  """
  if version is None:
    version = _installed_tensorflow_version()
  match = re.match(r'(\d+)\.(\d+)', version or '')
  if match and tuple(int(g) for g in match.groups()) < MIN_TENSORFLOW:
    need = '.'.join(map(str, MIN_TENSORFLOW))
    return (f'impala_tf needs TensorFlow >= {need}, found {version}: '
            f'pip install "tensorflow>={need}"')
  return None


# Older TensorFlow fails to start a tf.data `from_generator` pipeline under
# MirroredStrategy ("Unable to find FunctionDef for __inference_Dataset_from_generator_
# ... in the registry") when TensorFlow is first imported inside an absl app's main;
# imported before `app.run`, it works. Seen on 2.12, not on 2.15 (2.13-2.14 untried).
_IMPORT_BEFORE_APP_BELOW = (2, 15)


def import_tensorflow_if_old(import_fn: Optional[Callable[[], object]] = None
                             ) -> None:
  """Imports TensorFlow now if it is older than 2.15; call before `app.run`.

  Newer TensorFlow is left to the first module that needs it, so that flag errors
  come without the import's seconds.

  Args:
    import_fn: called first to import it (e.g. `impala_tf.quiet.quiet_tensorflow`,
      so that the early import is as quiet as the usual one); TensorFlow is
      imported afterwards in any case, since `import_fn` may decline to.
  """
  match = re.match(r'(\d+)\.(\d+)', _installed_tensorflow_version() or '')
  if match and tuple(int(g) for g in match.groups()) < _IMPORT_BEFORE_APP_BELOW:
    if import_fn is not None:
      import_fn()  # May import nothing (e.g. the user set TF_CPP_MIN_LOG_LEVEL).
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import


def _one_line(message: str) -> str:
  return ' '.join(str(message).split())


def exit_with_error(message: str, prog: Optional[str] = None) -> None:
  """Prints `<prog>: error: <message>` as one line on stderr and exits with 2."""
  prog = prog or prog_name()
  sys.stderr.write(f'{prog}: error: {_one_line(message)}\n')
  sys.stderr.flush()
  sys.exit(EXIT_USAGE)


_NON_BOOLEAN_RE = re.compile(
    r"^flag --(\w+)=(.*): \('Non-boolean argument to boolean flag', .*\)$")


def _flag_error_message(error: Exception) -> str:
  """A readable one-line message for a flag parsing error."""
  if isinstance(error, absl_flags.UnrecognizedFlagError):
    message = f'unknown flag --{error.flagname}'
    match = re.search(r'Did you mean: (.*) \?$', str(error))
    if match:
      names = ', '.join(f'--{n.strip()}' for n in match.group(1).split(','))
      message += f' (did you mean {names}?)'
    return message
  message = _one_line(str(error))
  if message.startswith('ERROR:: '):
    message = message[len('ERROR:: '):]
  match = _NON_BOOLEAN_RE.match(message)
  if match:
    name, value = match.groups()
    message = (f'flag --{name}={value}: expected true or false '
               f'(or --{name} / --no{name})')
  return message


def parse_flags(argv: Sequence[str],
                flag_values: absl_flags.FlagValues = FLAGS,
                prog: Optional[str] = None,
                allow_positional: bool = False) -> List[str]:
  """Parses the command line; a flag error exits with status 2 and one line.

  Use as `app.run(main, flags_parser=parse_flags)`. `--flagfile` and the help flags
  (`--help`, `--helpfull`) work as in absl.

  Args:
    argv: the command line, program name first.
    flag_values: the flags to parse into; absl's global FLAGS by default.
    prog: the program name for the error line; derived from argv[0] if None.
    allow_positional: accept arguments that are not flags. If False (the entry
      points take none) a positional argument is an error, which catches
      `--use_lstm false`.

  Returns:
    argv[0] and the arguments that are not flags.
  """
  prog = prog or prog_name(argv)
  version_error = tensorflow_version_error()
  if version_error:
    exit_with_error(version_error, prog)
  try:
    remaining = flag_values(list(argv))
  except absl_flags.Error as e:
    exit_with_error(_flag_error_message(e), prog)
  except ValueError as e:  # absl raises it for `--noflag=value`.
    exit_with_error(str(e), prog)
  if not allow_positional and len(remaining) > 1:
    exit_with_error(
        f'unexpected argument {remaining[1]!r}: options are flags, written '
        '--name=value', prog)
  return remaining


def exit_on_config_error(prog: Optional[str], fn: Callable, *args, **kwargs):
  """Returns fn(*args, **kwargs); a ConfigError exits with status 2 and one line.

  The line is `<prog>: error: --<field>=<value>: <allowed>`.

  Args:
    prog: the program name; derived from sys.argv if None.
    fn: the function to run, e.g. `config_from_flags`.
    *args: positional arguments of fn.
    **kwargs: keyword arguments of fn.

  Returns:
    What fn returns.
  """
  try:
    return fn(*args, **kwargs)
  except config_lib.ConfigError as e:
    exit_with_error(f'--{e}', prog)


def _format_default(spec: _Flag) -> str:
  value = _DEFAULTS[spec.name]
  if value is None and spec.kind == 'bool':
    return 'unset (auto)'
  if value is None:
    return 'none'
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, (tuple, list)):
    return ','.join(str(v) for v in value)
  return str(value)


def _format_type(spec: _Flag) -> str:
  if spec.kind in ('enum', 'network'):
    return ' \\| '.join(_ENUM_VALUES[spec.name])
  return {
      'string': 'string',
      'int': 'int',
      'float': 'float',
      'bool': 'bool',
      'optional_float': 'float or none',
      'int_list': 'int list',
  }[spec.kind]


def _md_cell(text: str) -> str:
  return text.replace('|', '\\|')


def generate_docs() -> str:
  """Returns the markdown of docs/flags.md: one table per section."""
  lines = [
      '# Flags',
      '',
      '<!-- Generated by `python -m impala_tf.flags > docs/flags.md`; do not edit. -->',
      '',
      'Every option of `python -m impala_tf.train` (and `impala_tf.evaluate`) is an '
      'absl flag with the name of the `impala_tf.config.Config` field it sets. '
      'Write `--name=value`; booleans also as `--name` / `--noname`; optional '
      'numbers take `none` for None (`--clip_rho_threshold=none`); lists are '
      'comma-separated (`--mlp_hidden_sizes=256,256`); integers accept `2e8` and '
      '`200_000_000`. `--flagfile=configs/atari_paper.cfg` reads flags from a file '
      '(flags after it override it); `--helpfull` lists every flag. A value out of '
      'range stops the program before it starts, with exit status 2 and one line '
      'on stderr naming the flag.',
      '',
  ]
  for _, title, section_flags in SECTIONS:
    lines += [f'## {title}', '', '| Flag | Type | Default | Description |',
              '|---|---|---|---|']
    for spec in section_flags:
      lines.append(
          f'| `--{spec.name}` | {_format_type(spec)} | '
          f'`{_md_cell(_format_default(spec))}` | {_md_cell(spec.help)} |')
    lines.append('')
  lines += _LOSS_REDUCTION_NOTES
  return '\n'.join(lines)


_LOSS_REDUCTION_NOTES = [
    '## Sum or mean: translating `--loss_reduction`',
    '',
    'With `--loss_reduction=sum` (the default, as in the paper and scalable_agent) '
    'every loss term is a sum over the valid steps of the batch, N of them (about '
    '`batch_size x unroll_length`); with `mean` it is divided by N, counted over the '
    'whole batch on every replica, so any number of replicas still gives the same '
    'update. The gradient of the mean is the gradient of the sum divided by N. To '
    'keep an update the same when switching from sum to mean:',
    '',
    '* `--learning_rate`: unchanged for Adam and RMSProp, which divide the gradient '
    'by its own running scale (exactly unchanged where epsilon is negligible).',
    '* `--adam_epsilon`: divide by N (it is added to sqrt(v), which scales with the '
    'gradient).',
    '* `--rmsprop_epsilon`: divide by N^2 (it is added to the mean square, under the '
    'root).',
    '* `--grad_clip`: divide by N (it bounds the global norm of the gradient).',
    '',
    '## RMSProp: tf1 or torch',
    '',
    'Both keep `ms <- decay * ms + (1 - decay) * g^2` per weight. `--rmsprop_style=tf1` '
    '(the default; the IMPALA paper, scalable_agent, TF1) steps `lr * g / sqrt(ms + '
    'eps)` with `ms` starting at 1; `torch` (PyTorch, TorchBeast) steps `lr * g / '
    '(sqrt(ms) + eps)` with `ms` starting at 0. Where `ms` is far above `eps^2` '
    '(torch) and `eps` (tf1) the two agree. Where gradients are small, tf1 steps '
    'about `lr * g / sqrt(eps)` (no per-weight scaling: plain SGD at `lr / '
    'sqrt(eps)`) and torch about `lr * g / eps`: TorchBeast\'s eps 0.01 at lr '
    '4.8e-4 takes steps up to 10x those of the same numbers under tf1. To carry a '
    'TorchBeast setting over, use `--rmsprop_style=torch` with its numbers; a tf1 '
    'epsilon E behaves like a torch epsilon of about sqrt(E) where the mean square '
    'is small. The first steps differ too: tf1 starts at `ms = 1` (small first '
    'steps), torch at 0 (the first step is about `lr / sqrt(1 - decay)` per '
    'weight, 10x lr at decay 0.99).',
    '',
    'With `--popart` the value errors and the advantages are divided by sigma, so '
    'these settings no longer depend on the scale of the rewards either; '
    '`--reward_scale` multiplies the rewards (before `--reward_clipping`) instead.',
    '',
]


def main(argv):
  del argv  # Unused.
  sys.stdout.write(generate_docs())


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  define_flags()
  app.run(main, flags_parser=parse_flags)
