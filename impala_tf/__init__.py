"""impala_tf: IMPALA (V-trace actor-critic) for TensorFlow 2."""

__version__ = '0.1.0'
