"""API families and the generic request features. Each module exposes ``register(app)``,
which adds its routes and hooks; handlers take ``(request, app)`` and return data (JSON, raw
bytes or an EventStream), never write bytes. A generating family is a
:class:`~llmsim.api.pipeline.Family` of the one request pipeline and defines its
:class:`~llmsim.streaming.dialect.Dialect` next to its renderer. Which modules an app is
assembled with is decided in one place, :mod:`llmsim.assemble`.
"""
