"""The pod-side agent. Standard library only; runs on the pod's python3 (>= 3.8).

Everything here is shipped to the pod in a zipapp (see ``gpuws.deploy``) and must not
import anything outside the standard library or ``gpuws.kernels`` (whose GPU imports are
lazy, inside functions).
"""

from gpuws import __version__ as AGENT_VERSION

__all__ = ["AGENT_VERSION"]
