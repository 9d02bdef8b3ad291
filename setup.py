"""Packaging for impala_tf.

Version ranges are the ones we have tried (newest tried in parentheses):
tensorflow 2.16-2.21 (2.21.0), numpy >=1.26 (2.4), gymnasium 1.x (1.4.0),
absl-py >=2.0 (2.5.1), ale-py >=0.9 (0.12.1).
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
        'tensorflow>=2.16,<2.22',
        'numpy>=1.26',
        'gymnasium>=1.0,<1.5',
        'absl-py>=2.0',
    ],
    extras_require={
        # gymnasium's AtariPreprocessing resizes frames with OpenCV.
        'atari': ['ale-py>=0.9', 'opencv-python-headless>=4.8'],
        'test': [
            'pytest>=8',
            'pytest-xdist>=3',
            # Legacy Keras for the TF_USE_LEGACY_KERAS=1 tests; must match tensorflow.
            'tf-keras>=2.16,<2.22',
            'ale-py>=0.9',
            'opencv-python-headless>=4.8',
        ],
        'bench': ['matplotlib>=3.7'],
    },
    classifiers=[
        'Programming Language :: Python :: 3',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
)
