from django import forms
from django.contrib.auth.forms import UserCreationForm

from accounts.models import User


class SignUpForm(UserCreationForm):
    """Username, e-mail and password twice; the new user joins the ``free`` tier."""

    class Meta(UserCreationForm.Meta):
        model = User
        fields = ("username", "email")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["email"].required = True


class DefaultSystemPromptForm(forms.ModelForm):
    """The system prompt every new conversation starts with (editable per conversation afterwards)."""

    class Meta:
        model = User
        fields = ("default_system_prompt",)
        labels = {"default_system_prompt": "Default system prompt for new chats"}
        widgets = {"default_system_prompt": forms.Textarea(attrs={"rows": 4, "maxlength": 4000})}


class AccountDeleteForm(forms.Form):
    """Deleting an account asks for its password and a typed confirmation."""

    password = forms.CharField(widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}))
    confirm = forms.CharField(label='Type "delete my account"')

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user

    def clean_password(self):
        password = self.cleaned_data["password"]
        if not self.user.check_password(password):
            raise forms.ValidationError("That is not your password.")
        return password

    def clean_confirm(self):
        confirm = self.cleaned_data["confirm"].strip().lower()
        if confirm != "delete my account":
            raise forms.ValidationError('Type "delete my account" to confirm.')
        return confirm
