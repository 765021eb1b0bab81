"""The two ready compositions — the gateway (bcs-api) and the Mesos driver (mesos-driver) — and
their app factories: where the layers are stacked and wired.
"""
