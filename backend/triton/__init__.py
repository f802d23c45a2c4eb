"""The Python-backend glue: TritonPythonModel classes, request inputs, parameters, metrics."""
