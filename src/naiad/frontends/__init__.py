"""Network frontends (HTTP/REST, gRPC): decode the wire into protocol types, call the Server facade, encode."""
