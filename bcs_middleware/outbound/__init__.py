"""The one outbound HTTP stack: every connection to an apiserver, webhook, driver or scheduler
is opened, verified, pooled, timed and failed over here.
"""
