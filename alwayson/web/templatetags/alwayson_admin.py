from django import template
from django.contrib import admin

register = template.Library()


@register.simple_tag(takes_context=True)
def admin_name(context, which):
    """The admin site's `site_header` or `site_title`. The admin's views put them in the
    context; the accounts' password pages render the admin's templates from Django's own
    views, which do not, and would say "Django administration"."""
    return context.get(which) or getattr(admin.site, which)
