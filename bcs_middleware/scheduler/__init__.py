"""The mesos-driver's protocol conversion: bcs v4 requests → the bcs-scheduler's ``/v1`` API.

:mod:`.routes` says which driver request becomes which scheduler call;
:mod:`.convert` builds the scheduler's types from the v4 documents.
"""
