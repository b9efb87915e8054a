from django.contrib import admin

from .models import User


# alwayson's admin picks an inbox's owner by autocomplete: the user model needs an admin
# with search_fields.
@admin.register(User)
class PersonAdmin(admin.ModelAdmin):
    list_display = ("email", "name", "team", "is_staff")
    search_fields = ("email", "name")
    filter_horizontal = ("groups", "user_permissions")
