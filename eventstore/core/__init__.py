"""The pure core: the chat session as data and the rules over it.

Everything here is a function of its arguments: models and the reducer, the diff, the
codec (bytes and hashes), the frozen rows storage exchanges, and the planning of appends,
turns and feed reads. Nothing imports storage, a driver, the engine, a thread, an event
loop or a clock, so every rule can be tested, and read, without a database.
"""
