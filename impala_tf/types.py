"""Data types shared by every module, and the conventions they follow.

Conventions (written once, here; every docstring in the package refers to them):

* **Time-major.** Sequences are `[T, B, ...]`: time first, then batch, then any
  trailing dims. A single unroll in the data pipeline is `[T + 1, ...]`; a batch of
  unrolls leaving `tf.data` is batch-major `[B, T + 1, ...]` (tf.data stacks along a
  new leading axis) and the learner transposes it to `[T + 1, B, ...]` on the device.
* **Unrolls overlap by one step.** An actor emits `unroll_length + 1` steps; the last
  step of one unroll is the first step of the next. The learner uses the last step only
  for its value (the bootstrap) and, with an LSTM, not at all for the loss.
* **Step `t` of an unroll** holds what the agent *saw* at `t` (the environment's
  output after action `t - 1`) and what it *did* at `t`:
  `observation[t]`, `reward[t]` (reward for action `t - 1`), `terminated[t]` /
  `truncated[t]` (`observation[t]` is the last of its episode), `first[t]`
  (`observation[t]` starts an episode), `prev_action[t]` (`action[t - 1]`, 0 when
  `first[t]`), `action[t]` and `behaviour_logits[t]`.
* **Episode ends** follow gymnasium's vector-env NEXT_STEP autoreset: after a step that
  ends an episode the next action is ignored and the env returns the first observation
  of a new episode with reward 0. Hence the transition out of a last observation is not
  a real transition: the learner gives it zero weight (`valid = ~(terminated |
  truncated)`). `terminated` cuts the return (discount 0); `truncated` (time limit)
  does not — the return is bootstrapped from the value of the final observation, which
  is in the unroll.
* **Dtypes.** Observations keep the environment's dtype (float32 vectors, uint8
  pixels) until the network: it casts them to its compute dtype and divides pixels
  by 255 (`AgentNetwork.scale_observation`; the learner does it once per batch, on
  its device, for all the steps that reuse the batch); rewards and logits float32;
  actions int32; flags bool; counters and versions int64.
* **Frames.** One env frame is one agent step times the env's action repeat (4 for
  Atari, 1 otherwise). `env_frames` counts frames the actors produced; `trained_frames`
  counts frames in SGD batches, once per use (so minibatch reuse counts each time);
  `replayed_frames` counts frames that entered batches from replay.
* **Losses** are sums over valid time steps and batch entries (as in the paper and
  scalable_agent), so a batch split over N replicas and all-reduced with SUM gives
  exactly the single-device gradient.
"""

import collections

# What an environment returns for a batch of envs at one step. Shapes `[B, ...]`.
EnvOutput = collections.namedtuple(
    'EnvOutput', ['observation', 'reward', 'terminated', 'truncated', 'first'])

# The network's input at one step (`[B, ...]`) or over an unroll (`[T, B, ...]`):
#   observation: env dtype; prev_action: int32; reward: float32 (unclipped by the
#   actor, clipped by the learner); first: bool, resets the recurrent core state.
AgentInput = collections.namedtuple(
    'AgentInput', ['observation', 'prev_action', 'reward', 'first'])

# The network's output: policy_logits float32 `[..., A]`, baseline float32 `[...]`.
AgentOutput = collections.namedtuple('AgentOutput', ['policy_logits', 'baseline'])

# One unroll of one environment, `[T + 1, ...]` per field (see the module docstring),
# plus per-unroll scalars:
#   core_state: tuple of float32 `[S]` tensors, the recurrent state before step 0
#     (`()` without a recurrent core).
#   policy_version: int64 `[]`, learner step of the weights that acted.
#   unroll_id: int64 `[]`, unique per fresh unroll (actor_id * 2**40 + counter).
#   replayed: bool `[]`, True when the unroll was drawn from replay.
Unroll = collections.namedtuple('Unroll', [
    'observation', 'reward', 'terminated', 'truncated', 'first', 'prev_action',
    'action', 'behaviour_logits', 'core_state', 'policy_version', 'unroll_id',
    'replayed'
])

# Per-episode statistics reported by actors: float return (unclipped game score),
# int length in agent steps.
EpisodeStats = collections.namedtuple('EpisodeStats', ['episode_return', 'length'])
