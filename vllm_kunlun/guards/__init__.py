"""Engine-start guards: the doctor's checks run while an engine starts, and the
runtime patches that turn a bad request or path into a clear error."""
