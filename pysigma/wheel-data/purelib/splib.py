"""σPy's ``splib`` module name: ``import splib`` as σPy programs do. See ``pysigma.splib``."""

from pysigma.splib import *  # noqa: F401,F403
from pysigma.splib import __all__  # noqa: F401
