"""The runtime room: the decision point, the state store and the evidence journal composed
behind one door (`governor.runtime.api.RuntimeAPI`).

Light on purpose: only the contract is re-exported. `governor.adapters.base` imports the
contract and `governor.runtime.edit` imports `governor.adapters.mcp`, so importing the
`Runtime` class here would make an import circle; callers import it from
`governor.runtime.core`.
"""

from governor.runtime.api import Admission, RuntimeAPI, governor_object

__all__ = ["Admission", "RuntimeAPI", "governor_object"]
