import sys

from tritonformer.client.openai_routes.runner import serve_forever

sys.exit(serve_forever())
