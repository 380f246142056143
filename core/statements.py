"""Statements the ORM compiles once, sent bound on the server; rows turned back into models.

What the commit's store (effects/store.py) and begin's store (workflow/store.py) share:

- ``insert(model, …)``: a model's INSERT exactly as ``save(force_insert=True)`` compiles it,
  compiled once per process (its text depends only on the columns), with each instance's
  values through the fields' own ``pre_save`` and ``get_db_prep_save``. A foreign key may
  name a row written by the same statement instead, or a column read beside it, under a
  WITH part's name.
- ``bound_cursor()``: a cursor whose parameters are bound on the server, so that psycopg
  can prepare the statement (core/poolers.py says when it may), kept for the thread's
  connection.
- ``loaded(model, values)`` and ``stored(obj, pk)``: rows as the ORM loads them
  (``Model.from_db``).
- ``statement_scope()``, ``statement_commits()`` and ``refused_by_server(exc)``: a write that
  is one statement, all or nothing by itself, runs as a transaction of its own in Django's
  autocommit, or in a savepoint of a caller's transaction; what a failure of it means.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from functools import cache
from typing import Any, TypeVar, cast

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import Model
from django.db.models.expressions import RawSQL
from django.db.models.sql import InsertQuery

M = TypeVar("M", bound=Model)


def database():
    """The default database's connection itself. ``django.db.connection`` is a proxy: each
    attribute read through it is a lookup in asgiref's ``Local`` (about 1.5 µs), and the
    values of one commit's rows pass it some thirty times (docs/PERFORMANCE.md)."""
    return connections[DEFAULT_DB_ALIAS]


class Insert:
    """The INSERT of a row of ``model``: its SQL, and the parameters of one instance.

    ``with_pk``: the instance brings its own primary key. ``returning``: the statement
    answers the new row's primary key. ``by_name`` (attname, name): that foreign key is the
    primary key of the row written under ``name`` in the same WITH statement; (attname,
    name, column): that column of the part ``name``."""

    def __init__(self, model: type[Model], *, with_pk: bool, returning: bool, by_name: tuple = ()):
        self.fields = [f for f in model._meta.concrete_fields if with_pk or not f.primary_key]
        self.by_name = {attname for attname, *_ in by_name}
        references = {}
        for attname, name, *named in by_name:
            (field,) = (f for f in self.fields if f.attname == attname)
            column = connection.ops.quote_name(named[0] if named else cast(Any, field).target_field.column)
            references[attname] = RawSQL(f"SELECT {column} FROM {name}", ())
        query = InsertQuery(model)
        # raw: the template's values only hold the places, so no field's pre_save runs on it
        # (a computed column such as core/chain.py's hashes would read rows it has not got).
        query.insert_values(self.fields, [model(**references)], raw=True)
        compiler = query.get_compiler(connection=connection)
        compiler.returning_fields = [model._meta.pk] if returning else None
        [(self.sql, _)] = compiler.as_sql()
        self.values = [f for f in self.fields if f.attname not in self.by_name]

    def params_for(self, obj: Model) -> list:
        """``obj``'s values as ``save()`` sends them (``pre_save`` fills the timestamps)."""
        params, db = [], database()
        for field in self.values:
            value = field.pre_save(obj, add=True)
            if hasattr(value, "resolve_expression"):
                raise ValueError(f"the insert of {type(obj).__name__}.{field.attname} takes a value, not an expression")
            params.append(field.get_db_prep_save(value, connection=db))
        return params


@cache
def insert(model: type[Model], *, with_pk: bool = False, returning: bool = True, by_name: tuple = ()) -> Insert:
    return Insert(model, with_pk=with_pk, returning=returning, by_name=by_name)


# Each thread's server-binding cursor, for the connection it was opened on.
_KEPT = threading.local()


def bound_cursor():
    """A cursor on Django's connection (so in its transaction, and wrapped as Django wraps
    every cursor) whose parameters are bound on the server on PostgreSQL: Django's own
    ``ServerBindingCursor``, which is what lets psycopg prepare a statement. Django's own
    queries stay client-side. Elsewhere, Django's own cursor. Use it as a context manager.

    On PostgreSQL the psycopg cursor is kept for the thread's connection and used again by
    the next statement: a psycopg cursor looks up a dumper for each parameter type and a
    loader for each column type once and keeps them, so a fresh cursor per statement looks
    them all up again (the commit's read, sent twice: 182 µs of client CPU on fresh cursors,
    113–132 µs on a kept one; docs/PERFORMANCE.md). A new connection gets a new cursor."""
    db = database()
    if db.vendor != "postgresql":
        return db.cursor()
    from django.db.backends.postgresql.base import ServerBindingCursor  # psycopg: PostgreSQL only

    db.ensure_connection()
    kept = getattr(_KEPT, "cursor", None)
    if kept is None or kept.closed or kept.connection is not db.connection:
        # The stubs know Django's cursor classes only through its wrappers.
        kept = _KEPT.cursor = cast(Any, ServerBindingCursor)(db.connection)
    wrap = db.make_debug_cursor if db.queries_logged else db.make_cursor
    # Django's wrapper closes its cursor on leaving a with block; this one stays open.
    return nullcontext(wrap(kept))


def loaded(model: type[M], values: dict[str, Any]) -> M:
    """A model instance of a row read from the database (``from_db`` takes the values in the
    model's own field order; the fields not given are deferred)."""
    names = [f.attname for f in model._meta.concrete_fields if f.attname in values]
    return model.from_db(DEFAULT_DB_ALIAS, names, [values[name] for name in names])


def stored(obj: M, pk: Any = None) -> M:
    """``obj`` as the row it was inserted as (with the id the database gave it, when given)."""
    values = {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}
    if pk is not None:
        values[type(obj)._meta.pk.attname] = pk
    return loaded(type(obj), values)


def statement_scope(*, durable: bool = False):
    """What holds a read and the one statement that writes after it: nothing in Django's
    autocommit, where each is a transaction of its own (``statement_commits``); a savepoint
    inside a caller's transaction, so that a write a key refused leaves that one usable."""
    return transaction.atomic(durable=durable) if database().in_atomic_block else nullcontext()


def statement_commits() -> bool:
    """Whether a statement sent now commits as it ends (no transaction is open around it):
    a failure while it runs may then have been applied."""
    return not database().in_atomic_block


def refused_by_server(exc: BaseException) -> bool:
    """Whether a database error is the server refusing a statement (its transaction then
    rolled back) rather than a connection lost or a server going down (SQLSTATE classes 08
    and 57), after which a statement that commits as it runs may have been applied."""
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate[:2] not in ("08", "57")
