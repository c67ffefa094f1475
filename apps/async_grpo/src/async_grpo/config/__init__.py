"""The run's configuration: typed dataclasses (`schema`), the named presets (`presets`),
the command line (`args`, on `tyro`) and the checks of every range and relation (`validate`).
Nothing here starts a process or imports the rest of the app's layers.
"""
