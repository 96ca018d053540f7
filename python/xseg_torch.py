"""The former name of the xseg package's PyTorch half, kept so that
``import xseg_torch; xseg_torch.install()`` goes on working: this module is
the xseg package itself."""

import os
import sys

try:
    import xseg as _xseg
except ImportError:  # run from a source tree: the package is beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import xseg as _xseg

sys.modules[__name__] = _xseg
