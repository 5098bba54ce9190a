"""The runtime room: the decision point, the state store and the evidence journal composed
behind one door (`governor.runtime.api.RuntimeAPI`, implemented by `governor.runtime.core.Runtime`).

Empty on purpose: the proxy and the control plane import the contract (`runtime.api`) and the
metrics (`runtime.metrics`) without loading the whole runtime.
"""
