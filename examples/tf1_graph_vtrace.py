"""V-trace and the IMPALA loss in TF1-style graph code, run by a tf.compat.v1.Session.

For codebases still written as graphs and sessions (like scalable_agent): the
functions of `impala_tf.vtrace` and `impala_tf.losses` are plain TensorFlow ops, so
they build into a `tf.Graph` like any other op. The script generates unrolls of a
contextual bandit (observation `x` float32 `[4]`, action 1 pays 1 when `x[0] > 0`,
action 0 pays 1 otherwise) with a uniformly random behaviour policy, and trains a
linear policy and baseline on them off-policy with V-trace and TF1's RMSProp. The
greedy policy's accuracy goes from about 50% to above 90%.

Run: `python examples/tf1_graph_vtrace.py` (a few seconds).
"""

import numpy as np
import tensorflow as tf

from impala_tf import losses
from impala_tf import vtrace

T, B, OBS, A = 10, 16, 4, 2


def generate_unrolls(rng):
  """A batch of time-major unrolls from the uniform behaviour policy."""
  obs = rng.normal(size=(T + 1, B, OBS)).astype(np.float32)
  actions = rng.integers(0, A, size=(T, B)).astype(np.int32)
  rewards = (actions == (obs[:-1, :, 0] > 0)).astype(np.float32)
  behaviour_logits = np.zeros((T, B, A), np.float32)  # Uniform.
  return obs, actions, rewards, behaviour_logits


def build_graph():
  """Placeholders, a linear policy + baseline, the loss and a train op."""
  v1 = tf.compat.v1
  ph = dict(
      obs=v1.placeholder(tf.float32, [T + 1, B, OBS], name='observation'),
      actions=v1.placeholder(tf.int32, [T, B], name='actions'),
      rewards=v1.placeholder(tf.float32, [T, B], name='rewards'),
      behaviour_logits=v1.placeholder(tf.float32, [T, B, A], name='behaviour_logits'))
  w = v1.get_variable('w', [OBS, A + 1], initializer=tf.zeros_initializer())
  b = v1.get_variable('b', [A + 1], initializer=tf.zeros_initializer())
  out = tf.reshape(tf.matmul(tf.reshape(ph['obs'], [-1, OBS]), w) + b,
                   [T + 1, B, A + 1])
  logits, values = out[..., :A], out[..., A]
  discounts = tf.fill([T, B], 0.9)
  trajectory = losses.Trajectory(
      target_logits=logits[:-1], values=values[:-1], bootstrap_value=values[-1],
      actions=ph['actions'], behaviour_logits=ph['behaviour_logits'],
      rewards=ph['rewards'], discounts=discounts, mask=tf.ones([T, B], tf.bool))
  loss, diagnostics = losses.compute_loss(
      trajectory, losses.LossOptions(baseline_cost=0.5, entropy_cost=0.001))
  # V-trace on its own, e.g. to log the targets (the loss above computes the same).
  targets = vtrace.from_logits(
      behaviour_policy_logits=ph['behaviour_logits'],
      target_policy_logits=logits[:-1], actions=ph['actions'], discounts=discounts,
      rewards=ph['rewards'], values=values[:-1], bootstrap_value=values[-1])
  train_op = v1.train.RMSPropOptimizer(
      0.01, decay=0.99, epsilon=0.1).minimize(loss)
  correct = tf.cast(ph['obs'][:-1, :, 0] > 0, tf.int32)
  greedy = tf.argmax(logits[:-1], axis=-1, output_type=tf.int32)
  accuracy = tf.reduce_mean(tf.cast(tf.equal(greedy, correct), tf.float32))
  return ph, train_op, loss, diagnostics, targets, accuracy


def main():
  rng = np.random.default_rng(0)
  graph = tf.Graph()
  with graph.as_default():
    ph, train_op, loss, diagnostics, targets, accuracy = build_graph()
    init = tf.compat.v1.global_variables_initializer()
  accuracies = []
  with tf.compat.v1.Session(graph=graph) as sess:
    sess.run(init)
    for step in range(300):
      obs, actions, rewards, behaviour_logits = generate_unrolls(rng)
      feed = {ph['obs']: obs, ph['actions']: actions, ph['rewards']: rewards,
              ph['behaviour_logits']: behaviour_logits}
      _, loss_v, diag, vs, acc = sess.run(
          [train_op, loss, diagnostics, targets.vs, accuracy], feed)
      accuracies.append(acc)
      if step % 100 == 0:
        print(f'step {step}: loss {loss_v:.2f} entropy/step '
              f'{diag["entropy_sum"] / diag["num_valid"]:.3f} mean vs {vs.mean():.3f} '
              f'greedy accuracy {acc:.2f}')
  final = float(np.mean(accuracies[-20:]))
  print(f'greedy accuracy: first step {accuracies[0]:.2f}, last 20 steps {final:.2f}')
  assert final > 0.9, final


if __name__ == '__main__':
  main()
