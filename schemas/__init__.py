"""The Avro schemas of every event, installed as ``distrl_stream.schemas`` (read by ``distrl_stream.events.store``).

A package, not a bare folder, so that an editable install finds it the way a wheel does.
"""
