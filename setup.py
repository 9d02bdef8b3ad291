"""Packaging for impala_tf.

Version ranges are the ones we have tried. CI tests the oldest and the newest
TensorFlow (.ci/run): tensorflow 2.12.1 (with numpy 1.24.3, gymnasium 1.3.0, keras
2.12 as tf.keras) and 2.21.0 (numpy 2.4, gymnasium 1.4.0, Keras 3; tf-keras 2.21).
TF 2.12 is the oldest release with Python 3.11 wheels and needs numpy <= 1.24.3,
hence numpy >= 1.22. absl-py >= 2.0 (2.5.1), ale-py >= 0.9 (0.12.1), OpenCV 4.11
(old numpy) and 5.0 (numpy 2), ray >= 2.60 (2.60.0).
"""

import os
import re

from setuptools import find_packages, setup

_HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
  # Read textually: importing impala_tf would import TensorFlow at build time.
  with open(os.path.join(_HERE, 'impala_tf', '__init__.py'), encoding='utf-8') as f:
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
  if not match:
    raise RuntimeError('impala_tf/__init__.py has no __version__ = "..." line')
  return match.group(1)


def _long_description():
  path = os.path.join(_HERE, 'README.md')
  if not os.path.exists(path):
    return ''
  with open(path, encoding='utf-8') as f:
    return f.read()


setup(
    name='impala_tf',
    version=_version(),
    description='IMPALA (V-trace actor-critic) for TensorFlow 2',
    long_description=_long_description(),
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    python_requires='>=3.10',
    packages=find_packages(include=['impala_tf', 'impala_tf.*']),
    install_requires=[
        'tensorflow>=2.12,<2.22',
        'numpy>=1.22',
        'gymnasium>=1.0,<1.5',
        'absl-py>=2.0',
    ],
    extras_require={
        # gymnasium's AtariPreprocessing resizes frames with OpenCV; EnvPool is the
        # faster Atari backend (--env_backend), with wheels for Linux.
        'atari': ['ale-py>=0.9', 'opencv-python-headless>=4.8',
                  'envpool>=1.2; sys_platform == "linux"'],
        # --actor_backend=ray (tried: ray 2.60.0).
        'ray': ['ray>=2.60,<3'],
        'test': [
            'pytest>=8',
            'pytest-xdist>=3',
            # tf-keras (TF_USE_LEGACY_KERAS=1 on TF >= 2.16) must match the installed
            # TensorFlow, which no requirement here can say: tests/keras_compat_test.py
            # is skipped without it, and .ci/run installs `tf-keras~=2.X.0`.
            'ale-py>=0.9',
            'opencv-python-headless>=4.8',
            'envpool>=1.2; sys_platform == "linux"',
            'ray>=2.60,<3',
            # impala_tf.evaluate --video, impala_tf.plot, and reading the event
            # files back with TensorBoard's own reader (tests/metrics_test.py).
            'imageio>=2.28',
            'imageio-ffmpeg>=0.4.8',
            'pygame>=2.1',
            'matplotlib>=3.7',
            'tensorboard>=2.12',
        ],
        # evaluate --video: mp4 (imageio + its ffmpeg plugin, which ships an ffmpeg
        # binary; a .gif needs only imageio), and pygame for classic-control frames.
        'video': ['imageio>=2.28', 'imageio-ffmpeg>=0.4.8', 'pygame>=2.1'],
        # python -m impala_tf.plot.
        'plot': ['matplotlib>=3.7'],
        # TensorFlow >= 2.21 no longer installs TensorBoard.
        'tensorboard': ['tensorboard>=2.12'],
        'bench': ['matplotlib>=3.7'],
    },
    classifiers=[
        'Programming Language :: Python :: 3',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
)
