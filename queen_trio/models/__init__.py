"""The wire's shapes, declared once as msgspec Structs: the routes decode and encode through
them, the OpenAPI document's schemas are generated from them (:mod:`.schema`), and the SDK
decodes the same ones. Field names are Python's; the wire spells them in camelCase."""
