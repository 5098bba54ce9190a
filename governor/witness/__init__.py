"""`governor witness`: a C2SP tlog-witness (c2sp.org/tlog-witness) as its own process.

`state.py` keeps the witness's key and what it last cosigned per log, durably; `server.py`
is the aiohttp app that answers `POST /add-checkpoint` and the monitoring `GET
/<origin hash>/checkpoint`. The decision itself is `governor.evidence.tlog.witness`.
"""
